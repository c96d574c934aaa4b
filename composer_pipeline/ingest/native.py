"""The compiled ingest path: sessions -> Arrow tables without a Python object per record.

In:  one session's scrubbed file buffers (pipeline.py reads and scrubs them).
Out: rows appended to a :class:`Builder` (``_native``, C++ in ``ingest/csrc/``), handed over as
``trace_states``/``trace_messages``/``quarantine`` Arrow tables by :meth:`Builder.take`.

It is the twin of parser.py + states.py, rule for rule: the Python code is the reference, and every
ingest test (tests/ingest/engines.py) runs every real trace, the samples, each pitfall fixture and
fuzzed sessions (test_native.py) through both and requires identical tables, reports and counts. A
session the native code cannot reproduce exactly (invalid UTF-8 to repair, a line only the Python
reader accepts, ``str()`` of a non-string id, a float or 64+-bit integer to re-serialize) is
reported back with the reason and ingested by the Python engine instead; ``IngestResult.engine``
and ``fallback_reason`` say which engine ran and why.

Why it exists: bench/RESULTS.md. Decoding into Python objects and transposing them into Arrow
cost more than 2.5x orjson's bare decode; here each line is validated and read in one pass and
the columns are written as Arrow buffers directly.

The extension is optional (``[[tool.setuptools.ext-modules]]`` in pyproject.toml): where it did not
compile, or its sources changed after it was built, :data:`AVAILABLE` is False (:data:`IMPORT_ERROR`
says why) and ingest runs the Python engine.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from composer_pipeline import tables

CSRC = Path(__file__).with_name("csrc")


# the agent whose sessions this engine reads (the ``source`` column)
SOURCE = "claude"


def stale_sources(module_file: str | Path, csrc: Path = CSRC) -> list[str]:
    """C++ sources modified after the compiled module was built (a pull or checkout that changes them
    updates their times); empty where the sources are not shipped (a wheel install)."""
    if not csrc.is_dir():
        return []
    built = Path(module_file).stat().st_mtime
    return sorted(p.name for p in csrc.iterdir() if p.suffix in (".h", ".cpp") and p.stat().st_mtime > built)


# (its interface: _native.pyi)
try:
    from composer_pipeline.ingest import _native
# not compiled here: the Python engine is used
except ImportError as e:
    IMPORT_ERROR: str | None = str(e)
else:
    IMPORT_ERROR = None
    _stale = stale_sources(_native.__file__)
    if _stale:
        # an in-place build older than the sources beside it: its rules may differ from the Python
        # reference, so it is not used until rebuilt
        IMPORT_ERROR = (
            f"the compiled ingest engine is older than {', '.join(_stale)} in composer_pipeline/ingest/csrc; "
            "rebuild it with `.venv/bin/pip install -e .` (or `python3 -m composer_pipeline.bootstrap test`)"
        )

AVAILABLE = IMPORT_ERROR is None
TABLES = ("trace_states", "trace_messages", "quarantine")


# value length -> its int32 offsets 0, len, 2 len, ... for at least as many rows as asked so far: built
# once and sliced (``array("i", range(...))`` costs ~0.3 ms per 8000 rows; numpy is not loaded in the
# ingest CLI, cli/ingest.py)
_CONSTANT_OFFSETS: dict[int, pa.Buffer] = {}


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` times ``value`` as a string array, built from buffers (``pa.array`` and ``pa.scalar`` import
    pandas where pyarrow has numpy: ~0.3-1 CPU-s of an ingest run)."""
    data = value.encode()
    offsets = _CONSTANT_OFFSETS.get(len(data))
    if offsets is None or offsets.size < 4 * (n + 1):
        rows = max(n, 2 * (offsets.size // 4) if offsets is not None else 1024)
        steps = array("i", range(0, len(data) * (rows + 1), len(data))) if data else array("i", [0]) * (rows + 1)
        offsets = _CONSTANT_OFFSETS[len(data)] = pa.py_buffer(steps)
    return pa.Array.from_buffers(pa.string(), n, [None, offsets.slice(0, 4 * (n + 1)), pa.py_buffer(data * n)])


def _require() -> None:
    """Raise unless the compiled module is importable and current (:data:`AVAILABLE`)."""
    if not AVAILABLE:
        raise RuntimeError(f"the native ingest extension is not built here ({IMPORT_ERROR})")


def _array(spec: Any, typ: pa.DataType) -> pa.Array:
    """One column spec from ``Builder.flush`` -> an Arrow array (zero-copy over the native buffers)."""
    if pa.types.is_list(typ):
        (kind, n, _nulls, bufs), child = spec
        return pa.ListArray.from_buffers(
            typ, n, [None, pa.py_buffer(bufs[1])], children=[_array(child, typ.value_type)]
        )
    kind, n, nulls, bufs = spec
    buffers = [None if b is None else pa.py_buffer(b) for b in bufs]
    return pa.Array.from_buffers(typ, n, buffers, null_count=nulls)


class Builder:
    """Accumulates the rows of many sessions natively; :meth:`take` returns them as Arrow tables."""

    def __init__(self) -> None:
        _require()
        self._b = _native.Builder()

    def add_session(
        self,
        session_key: str,
        default_session_id: str,
        files: list[tuple],
        classify: Callable[[int, int, bytes], tuple | None],
        compaction_full: bool,
        drop_warmup: bool,
    ) -> tuple:
        """See module.cpp: ``(True, stats, per_file)`` or ``(False, reason)`` (nothing kept)."""
        return self._b.add_session(session_key, default_session_id, files, classify, compaction_full, drop_warmup)

    def rows(self) -> int:
        return self._b.rows()

    def nbytes(self) -> int:
        return self._b.nbytes()

    def take(self) -> dict[str, pa.Table]:
        specs = self._b.flush()
        out = {}
        for name in TABLES:
            schema = tables.SCHEMAS[name]
            arrays = [_array(spec, f.type) for spec, f in zip(specs[name], schema)]
            # the compiled engine reads Claude Code sessions only: their ``source`` is a constant
            n = len(arrays[0]) if arrays else 0
            arrays += [constant_strings(SOURCE, n) for _ in list(schema)[len(arrays) :]]
            out[name] = pa.Table.from_arrays(arrays, schema=schema)
        return out


# test hooks (the helpers the C++ code relies on, compared with Python in the tests)
def canonicalize_json_bytes(data: bytes) -> bytes | None:
    """The compiled engine's canonical re-serialization of one JSON document (``None``: one it leaves to
    Python); not the cache key's :func:`composer_pipeline.teachers.cache.canonical_json`."""
    _require()
    return _native.canonical_json(data)


def py_strip(text: str) -> str:
    _require()
    return _native.py_strip(text)


def sha256_hex(data: bytes, portable: bool = False) -> str:
    _require()
    return _native.sha256_hex(data, portable)


def utf8_valid(data: bytes) -> bool:
    _require()
    return _native.utf8_valid(data)


def reads_line(line: bytes) -> bool:
    _require()
    return _native.reads_line(line)
