"""``composer-pipeline ingest PATH... --out DIR [--recipe FILE] [--engine auto|native|python] [--source auto|claude|codex]``:
sessions (Claude Code or Codex CLI) -> Parquet.

Writes ``trace_states.parquet``, ``trace_messages.parquet`` and ``quarantine.parquet`` under DIR
(local or ``s3://``), streaming session by session; prints one JSON line per input file and a
final totals line (with secrets scrubbed per kind, the engine that ran, and how many sessions the
compiled engine handed to the Python one, with why).
"""

from __future__ import annotations

import argparse
import json
import sys

# low-cardinality columns only: dictionary-encoding raw lines and JSON content wastes time
DICTIONARY_COLUMNS = (
    "session_id",
    "session_key",
    "stream_id",
    "stream_kind",
    "agent_id",
    "parent_tool_use_id",
    "source_file",
    "record_type",
    "subtype",
    "role",
    "model",
    "version",
    "reason",
)
# large JSON/text columns: min/max statistics of them help no reader and cost ~10 % of the write
NO_STATISTICS_COLUMNS = ("raw", "content", "tool_use_result", "action", "usage", "error_after", "text")
# the session stats summed into the totals line, in its order
TOTALS = (
    "states",
    "messages",
    "bad_lines",
    "subagents_linked",
    "compactions_crossed",
    "warmup_dropped",
    "streams",
    "damaged_bridged",
)
# messages per Parquet row group (bounds memory; 4000-row groups cost ~10 % more to write)
FLUSH_ROWS = 8000
# ...or sooner, for sessions with very large lines
FLUSH_BYTES = 32 << 20
# Tables with fewer rows than messages (a flush of 8000 messages carries ~2,500 states) are held over
# flushes until they have HELD_ROWS rows (or FLUSH_BYTES), then written as one row group: the same rows in
# the same order, in half the row groups, ~0.009 CPU-s less per 200 MB of sessions (bench/RESULTS.md: each
# column chunk costs the writer a compression context per page and more). Holding more saves the writer
# little more and costs the compiled engine fresh pages for the buffers held (no gain at 8000 rows).
# trace_messages is written at every flush, as before.
HELD_TABLES = ("trace_states", "quarantine")
HELD_ROWS = 4000


class TableWriteFailed(Exception):
    """Writing the output table ``table`` failed with ``error`` (pyarrow's write errors name no file)."""

    def __init__(self, table: str, error: OSError):
        super().__init__(table, error)
        self.table = table
        self.error = error


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ingest", help="parse Claude Code sessions and Codex CLI rollouts into trace states (Parquet)"
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="session file or directory (walked recursively)")
    p.add_argument("--out", required=True, help="output directory (local path or s3://bucket/prefix)")
    p.add_argument("--recipe", default=None, help="ingest recipe YAML (default: built-in defaults)")
    # recipe.ENGINES, spelled out: importing the recipe module here would load pyarrow for every command
    p.add_argument(
        "--engine",
        choices=("auto", "native", "python"),
        default=None,
        help="parser engine (default: the recipe's, auto): native = compiled, python = the reference; same output",
    )
    p.add_argument(
        "--source",
        choices=("auto", "claude", "codex"),
        default=None,
        help="the agent that wrote the sessions (default: the recipe's, auto: detected per file): claude | codex",
    )
    p.set_defaults(func=run)


def _open_outputs(out: str, names, stack) -> tuple[dict, dict, str]:
    """One writable file per table under ``out`` (closed by ``stack``), each table's path for errors, and
    the location to report.

    A plain local path is opened natively (``pyarrow.OSFile``): no fsspec import (~0.07-0.15 CPU-s of
    every start-up) and no Python callback per write. Each is a temporary file renamed over
    ``<name>.parquet`` only when ``stack`` closes without an error (``store.staged``), so a failed run
    leaves the previous output whole. URLs (``s3://``, ``file://``) go through ``Store``.
    """
    if "://" not in out:
        import os

        import pyarrow as pa

        from composer_pipeline.store import staged

        base = os.path.expanduser(out.rstrip("/") or "/")
        base = base if os.path.isabs(base) else os.path.abspath(base)  # as Store.url() spells it
        os.makedirs(base, exist_ok=True)
        paths = {n: os.path.join(base, f"{n}.parquet") for n in names}
        tmps = {n: stack.enter_context(staged(paths[n])) for n in names}
        return {n: stack.enter_context(pa.OSFile(tmps[n], "wb")) for n in names}, paths, base
    from composer_pipeline.store import Store, open_replacing

    store = Store(out)
    store.fs.makedirs(store.base, exist_ok=True)
    paths = {n: store.url(f"{n}.parquet") for n in names}
    return (
        {n: stack.enter_context(open_replacing(store.fs, store.path(f"{n}.parquet"), paths[n])) for n in names},
        paths,
        store.url(),
    )


def choose_arrow_allocator() -> None:
    """Arrow's jemalloc pool for this process, chosen before pyarrow is imported (Arrow reads
    ``ARROW_DEFAULT_MEMORY_POOL`` once, at import, and the Parquet writer's pages always come from that
    default pool). mimalloc, the default, hands the pages of each written row group back to the kernel
    and faults them in again as zeroed huge pages; jemalloc keeps them: ~5 % less CPU and ~30 MB less
    peak RSS per 500 MB of sessions (bench/RESULTS.md), the same bytes written. Linux only (pyarrow's
    wheels there include jemalloc); a value the user set wins, and a process that already imported
    pyarrow (a test calling ``main``) keeps what it has."""
    import os

    if sys.platform.startswith("linux") and "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")


def load_arrow_without_numpy() -> None:
    """Import pyarrow as if numpy were not installed: ingest never converts to or from numpy, and numpy's
    import is ~0.055 CPU-s of every ingest process (~6 % of the process on 200 MB of sessions,
    bench/RESULTS.md). pyarrow imports numpy once, in ``pyarrow.lib``, wherever it is installed; hidden
    for that import, pyarrow's numpy interop stays off in this process (``to_numpy`` raises, and
    ``pa.array`` no longer looks for pandas), while numpy itself can still be imported later (the secret
    prefilter's RE2 fallback does). Ingest's own modules build their buffers without numpy. A process
    that already imported either (a test calling ``main``) keeps what it has."""
    if "pyarrow" in sys.modules or "numpy" in sys.modules:
        return
    # None in sys.modules makes `import numpy` raise ImportError (the import system's documented rule);
    # typeshed types the mapping as modules only
    sys.modules["numpy"] = None  # type: ignore[assignment]
    try:
        import pyarrow  # noqa: F401
    finally:
        del sys.modules["numpy"]


def run(args: argparse.Namespace) -> int:
    import contextlib

    choose_arrow_allocator()
    load_arrow_without_numpy()
    from composer_pipeline.ingest.config import IngestRecipe
    from composer_pipeline.ingest.pipeline import TABLES, SessionIngester

    recipe = IngestRecipe.load(args.recipe)
    ingester = SessionIngester(recipe, args.engine, args.source)
    # the outputs replace the previous ones only if all are written
    with contextlib.ExitStack() as stack:
        handles, paths, out_url = _open_outputs(args.out, TABLES, stack)
        try:
            totals, secrets, files = _ingest(args, ingester, handles)
        except TableWriteFailed as e:
            from composer_pipeline.store import path_error

            raise path_error(e.error, paths[e.table]) from e.error
    engine = {"engine": ingester.engine, "python_fallback_sessions": sum(ingester.fallbacks.values())}
    if ingester.fallbacks:
        engine["python_fallback_reasons"] = dict(ingester.fallbacks)
    print(
        json.dumps(
            {"total": True, "files": files, **dict(totals), "secrets_scrubbed": dict(secrets), **engine, "out": out_url}
        )
    )
    sys.stdout.flush()
    return 0


def _row_group(held: list | None, t, last: bool):
    """The row group to write now of a table just taken, ``t``, or None: for a table of HELD_TABLES,
    ``t`` is added to what it ``held`` and that is written, as one table, once it has HELD_ROWS rows or
    FLUSH_BYTES bytes or this is the ``last`` flush; any other table's ``t`` is written (``held`` None)."""
    import pyarrow as pa

    if held is None:
        return t if t.num_rows else None
    if t.num_rows:
        held.append(t)
    if not held or not (
        last or sum(p.num_rows for p in held) >= HELD_ROWS or sum(p.nbytes for p in held) >= FLUSH_BYTES
    ):
        return None
    out = held[0] if len(held) == 1 else pa.concat_tables(held)
    held.clear()
    return out


def _ingest(args: argparse.Namespace, ingester, handles: dict):
    """Every session of ``args.paths`` written to ``handles``; (totals, secrets, files). A failed write
    is raised as :class:`TableWriteFailed`, naming the table being written."""
    import gc
    from collections import Counter

    import pyarrow.parquet as pq

    from composer_pipeline import tables
    from composer_pipeline.ingest.discover import discover_sessions
    from composer_pipeline.ingest.pipeline import TABLES
    from composer_pipeline.ingest.remote import local_root

    writers = {
        n: pq.ParquetWriter(
            handles[n],
            tables.SCHEMAS[n],
            compression="zstd",
            compression_level=1,
            use_dictionary=[c for c in DICTIONARY_COLUMNS if c in tables.SCHEMAS[n].names],
            write_statistics=[c for c in tables.SCHEMAS[n].names if c not in NO_STATISTICS_COLUMNS],
        )
        for n in TABLES
    }
    frozen = False
    # taken from the ingester, not yet written (HELD_TABLES only)
    held: dict[str, list] = {n: [] for n in HELD_TABLES}

    # many small sessions -> one row group per ~FLUSH_ROWS messages
    def flush(last: bool = False) -> None:
        nonlocal frozen
        for n, t in ingester.take().items():
            t = _row_group(held.get(n), t, last)
            if t is not None:
                try:
                    writers[n].write_table(t, row_group_size=max(t.num_rows, 1))
                except OSError as e:
                    raise TableWriteFailed(n, e) from e
        # pyarrow has now imported pandas (at its first table): freeze those objects too
        if not frozen:
            gc.freeze()
            frozen = True

    # Parsing allocates many objects, so the cyclic GC runs often; without this every full collection
    # walks the objects of every imported module (pandas alone: ~10 % of ingest CPU). None of them
    # is garbage; ingest's own records are acyclic and freed by reference counting as before.
    gc.freeze()

    # json.dumps' output, from one encoder (dumps makes its default one check for cycles, which a report of
    # counts has none of: ~0.7 µs of each file's line)
    report_json = json.JSONEncoder(check_circular=False)
    totals: Counter = Counter()
    secrets: Counter = Counter()
    files, done = 0, False
    try:
        for path in args.paths:
            # (an s3:// root: its local mirror, brought up to date)
            for sf in discover_sessions(local_root(path)):
                rep = ingester.add(sf)
                if ingester.pending_rows() >= FLUSH_ROWS or ingester.pending_bytes() >= FLUSH_BYTES:
                    flush()
                for r in rep.file_reports:
                    files += 1
                    print(report_json.encode(r), flush=False)
                stats = rep.stats
                for k in TOTALS:
                    totals[k] += stats.get(k, 0)
                totals["sessions"] += 1
                # (Counter.update is a Python call even when there is nothing to add, as nearly always)
                if rep.secrets:
                    secrets.update(rep.secrets)
        flush(last=True)
        done = True
    finally:
        for n in TABLES:
            try:
                # (writes the footer) the handles are closed by the caller's stack
                writers[n].close()
            except OSError as e:
                # (after an earlier error, that one is raised)
                if done:
                    raise TableWriteFailed(n, e) from e
    return totals, secrets, files
