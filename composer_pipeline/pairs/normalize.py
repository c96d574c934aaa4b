"""Normalise DPO pairs with data-juicer ops, in-process, without losing a row.

In:  a ``dpo_pairs`` table and a :class:`NormalizeRecipe` (``recipes/normalize.yaml``: an ordinary
     data-juicer recipe, one op instance per ``text_key``).
Out: :class:`NormalizeResult`: ``kept`` (``normalized_dpo_pairs``), ``dropped`` (``dropped_pairs``,
     each with ``drop_op``, ``drop_reason`` and ``drop_stats`` JSON) and ``stats``
     (``dropped_by_op``, ``seconds``, ``rows_per_s``).

How it runs. The recipe's ops are data-juicer's own op objects (``load_ops``); we call their
``compute_stats_batched``/``process_batched`` (filters) and ``compute_hash`` (deduplicators) on
plain Python lists, one batch per op, instead of letting ``DefaultExecutor`` build a HuggingFace
dataset, map/filter it through worker pools and export it. Same ops, same thresholds, same
first-occurrence dedup, same results (``bench/bench_normalize.py`` asserts identical surviving
pair ids against ``DefaultExecutor``), ~19x faster on 10k pairs on a 2-core machine. Only the text columns an
op names are handed to data-juicer; every other column (nested prompt messages, lineage ids) is
taken back from the input table by row index, so it round-trips byte for byte.

data-juicer traps handled here (each measured on py-data-juicer 1.6.1; tests/pairs/test_normalize.py):
* stats collide across keys (``text_len`` of ``chosen_text`` reused for ``rejected_text``): each op
  instance gets a fresh stats dict, so a pair whose *rejected* side alone fails a filter is dropped;
* ``skip_op_error`` drops whole batches silently: forced off; a batch that raises is re-run row by
  row and only the failing row is dropped, with drop_op = the op and the exception as reason;
* run-time ``uv pip install`` of missing modules: made to raise instead (``LazyLoader``);
* stdout/stderr hijack and loguru handler removal on import: undone after every call;
* fork start method / worker pools: never started (no ``datasets.map(num_proc=...)``), so this
  is safe inside a threaded Dagster process.

Running the same recipe on Ray for large corpora. Export the text columns (``pair_id``,
``chosen_text``, ``rejected_text`` and, for dedup, ``pair_text`` = prompt + "\n\x1e\n" +
chosen_text + "\n\x1e\n" + rejected_text, see :func:`pair_text_column`) to JSONL, copy
``recipes/normalize.yaml`` and add ``executor_type: ray``, ``ray_address: auto`` (a running
cluster; ``local`` starts one in-process), ``dataset_path`` and ``export_path``; rename
``document_deduplicator`` to ``ray_document_deduplicator`` (the plain one is not supported on
Ray); run ``dj-process --config ray_normalize.yaml``. Keep one op instance per text key and, for
filters on both keys, one run per key: the stats collision exists on Ray too. The export is a
folder of JSON part files; join the surviving ``pair_id`` s back to the full pair table with
DuckDB or pyarrow (dropped = anti-join), so nested columns never travel through Ray. Checked on
300 synthetic pairs (rejected-side length filter + ray dedup, ``ray_address: local``): same 265
surviving ids as :func:`normalize_pairs`, 23 s including Ray start-up.

Deliberately simplified: only Filter and Deduplicator ops are accepted (a Mapper would rewrite
``chosen_text`` without rewriting the ``chosen`` Action JSON); filters run as one batch per op.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson
import pyarrow as pa
import yaml

from composer_pipeline import tables

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "normalize.yaml"
DERIVED_KEYS = ("pair_text",)  # computed here: prompt + chosen_text + rejected_text
_STATS = "__dj__stats__"
_GUARD_LOCK = threading.RLock()  # the guard patches process-wide state: one holder at a time


@dataclass(frozen=True)
class NormalizeRecipe:
    """A data-juicer recipe: ordered ``process`` ops, each with its ``text_key``."""

    process: tuple[tuple[str, dict[str, Any]], ...]
    default_text_key: str = "chosen_text"
    path: str | None = None
    # recipe ``executor_type``: ``default`` = the in-process path below; ``ray`` = data-juicer's
    # RayExecutor (normalize_ray.py) at ``ray_address``, scratch JSONL under ``work_dir``
    executor: str = "default"
    ray_address: str | None = None
    ray_work_dir: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: str | None = None) -> "NormalizeRecipe":
        if d.get("skip_op_error", False):
            raise ValueError(
                "normalize recipe: skip_op_error: true would let data-juicer silently drop whole batches; "
                "set it to false (failing rows are dropped one by one with their reason)"
            )
        tk = d.get("text_keys", "chosen_text")
        default_key = tk[0] if isinstance(tk, list) else str(tk)
        ops: list[tuple[str, dict[str, Any]]] = []
        for i, item in enumerate(d.get("process") or []):
            if isinstance(item, str):
                item = {item: {}}
            if not isinstance(item, dict) or len(item) != 1:
                raise ValueError(f"normalize recipe: process[{i}] must be {{op_name: {{args}}}}")
            (name, args), = item.items()
            args = dict(args or {})
            if args.get("skip_op_error"):
                raise ValueError(f"normalize recipe: process[{i}] {name}: skip_op_error must be false")
            args.setdefault("text_key", default_key)
            ops.append((str(name), args))
        if not ops:
            raise ValueError("normalize recipe: empty process list")
        allowed = set(tables.DPO_PAIRS.names) | set(DERIVED_KEYS)
        for name, args in ops:
            if args["text_key"] not in allowed:
                raise ValueError(f"normalize recipe: {name}: text_key {args['text_key']!r} is not a pair column")
        # data-juicer's own keys, so the file stays a valid data-juicer recipe (normalize_ray.py)
        executor = str(d.get("executor_type") or "default")
        if executor not in ("default", "ray"):
            raise ValueError(f"normalize recipe: executor_type must be 'default' or 'ray', got {executor!r}")
        return cls(process=tuple(ops), default_text_key=default_key, path=path, executor=executor,
                   ray_address=d.get("ray_address"), ray_work_dir=d.get("work_dir") if executor == "ray" else None)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "NormalizeRecipe":
        p = Path(path) if path else DEFAULT_RECIPE
        if not p.is_file():
            raise FileNotFoundError(f"normalize recipe not found: {p}")
        return cls.from_dict(yaml.safe_load(p.read_text()) or {}, path=str(p))

    def text_keys(self) -> list[str]:
        return sorted({a["text_key"] for _, a in self.process})


@dataclass
class NormalizeResult:
    kept: pa.Table
    dropped: pa.Table
    stats: dict[str, Any] = field(default_factory=dict)


class AutoInstallBlocked(RuntimeError):
    """data-juicer tried to pip/uv-install a package at run time."""


@contextlib.contextmanager
def data_juicer_guard() -> Iterator[None]:
    """Import data-juicer with its side effects contained; restore stdout/stderr/loguru after."""
    with _GUARD_LOCK:
        with _guarded():
            yield


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    from loguru import logger

    saved_out, saved_err = sys.stdout, sys.stderr
    before = set(logger._core.handlers)  # noqa: SLF001 - loguru has no public listing
    real_remove = logger.remove

    def _remove_only_new(handler_id=None):
        if handler_id is None:  # data-juicer's blanket logger.remove(): spare the host's handlers
            for hid in set(logger._core.handlers) - before:  # noqa: SLF001
                real_remove(hid)
        elif handler_id not in before:
            real_remove(handler_id)

    logger.remove = _remove_only_new  # type: ignore[method-assign]
    try:
        from data_juicer.utils.lazy_loader import LazyLoader

        real_install = LazyLoader.__dict__["_install_package"]

        def _refuse(cls, package_spec, pip_args=None):
            raise AutoInstallBlocked(
                f"data-juicer tried to install {package_spec!r} at run time; install it into the environment "
                "up front (pinned in pyproject.toml) instead"
            )

        LazyLoader._install_package = classmethod(_refuse)
        try:
            yield
        finally:
            LazyLoader._install_package = real_install
    finally:
        logger.remove = real_remove  # type: ignore[method-assign]
        for hid in set(logger._core.handlers) - before:  # noqa: SLF001
            real_remove(hid)
        sys.stdout, sys.stderr = saved_out, saved_err


def _bounds(op) -> dict[str, Any]:
    out = {}
    for k, v in vars(op).items():
        if (k.startswith("min_") or k.startswith("max_")) and isinstance(v, (int, float)) and not isinstance(v, bool):
            if k in ("min_closed_interval", "max_closed_interval"):
                continue
            out[k] = v if abs(v) < 1e18 else None  # sys.maxsize = unbounded
    return out


def _texts(pairs: pa.Table, key: str) -> list:
    if key == "pair_text":
        p, c, r = (pairs.column(k).to_pylist() for k in ("prompt", "chosen_text", "rejected_text"))
        return [
            None if (a is None or b is None or d is None) else f"{a}\n\x1e\n{b}\n\x1e\n{d}" for a, b, d in zip(p, c, r)
        ]
    return pairs.column(key).to_pylist()


def pair_text_column(pairs: pa.Table) -> list:
    """The dedup text of each pair (prompt, chosen_text, rejected_text joined), as the recipe sees it."""
    return _texts(pairs, "pair_text")


def _run_filter(op, key: str, idx: list[int], texts: list, drop: dict[int, tuple[str, str, dict]]) -> list[int]:
    from data_juicer.utils.constant import Fields

    name = op._name
    bounds = _bounds(op)

    def one_batch(sub: list[int]) -> tuple[list[dict], list[bool]]:
        samples = {key: [texts[i] for i in sub], _STATS: [{} for _ in sub], Fields.context: [{} for _ in sub]}
        if op.is_batched_op():
            samples = op.compute_stats_batched(samples)
            keep = list(op.process_batched(samples))
        else:
            stats_out = []
            for j in range(len(sub)):
                s = op.compute_stats_single({key: samples[key][j], _STATS: samples[_STATS][j], Fields.context: {}})
                stats_out.append(s[_STATS])
            samples[_STATS] = stats_out
            keep = [op.process_single({_STATS: s}) for s in stats_out]
        if len(keep) != len(sub):
            raise RuntimeError(f"{name} returned {len(keep)} decisions for {len(sub)} rows")
        return samples[_STATS], [bool(k) for k in keep]

    try:
        results = [(idx, *one_batch(idx))]
    except AutoInstallBlocked:
        raise
    except Exception:  # isolate the failing row(s): re-run row by row
        results = []
        for i in idx:
            try:
                results.append(([i], *one_batch([i])))
            except AutoInstallBlocked:
                raise
            except Exception as e:  # noqa: BLE001 - the reason is recorded on the row
                drop[i] = (name, f"{key}: op error {type(e).__name__}: {e}", {"text_key": key, "error": repr(e)})
    survivors: list[int] = []
    for sub, stats, keep in results:
        for i, st, k in zip(sub, stats, keep):
            if k:
                survivors.append(i)
            else:
                shown = ", ".join(f"{s}={v:.4g}" if isinstance(v, float) else f"{s}={v}" for s, v in st.items())
                drop[i] = (name, f"{key}: {shown} outside {bounds}", {"text_key": key, **st, "bounds": bounds})
    survivors.sort()
    return survivors


def _run_dedup(op, key: str, idx: list[int], texts: list, pair_ids: list, drop) -> list[int]:
    from data_juicer.utils.constant import HashKeys

    name = op._name
    if name == "document_deduplicator":  # exact md5: first occurrence wins, as in its process()
        first: dict[str, int] = {}
        survivors = []
        for i in idx:
            h = op.compute_hash({key: texts[i]})[HashKeys.hash]
            if h in first:
                j = first[h]
                drop[i] = (name, f"{key}: duplicate of pair {pair_ids[j]}", {"text_key": key, "hash": h, "duplicate_of": pair_ids[j]})
            else:
                first[h] = i
                survivors.append(i)
        return survivors
    # any other deduplicator (simhash, minhash...): its own dataset-level algorithm, in-process
    from datasets import Dataset

    ds = Dataset.from_dict({key: [texts[i] for i in idx], "__row__": idx})
    ds = ds.map(op.compute_hash, num_proc=None, load_from_cache_file=False)
    out, _ = op.process(ds)
    survivors = sorted(out["__row__"])
    gone = set(idx) - set(survivors)
    for i in gone:
        drop[i] = (name, f"{key}: near-duplicate removed by {name}", {"text_key": key})
    return survivors


def normalize_pairs(pairs: pa.Table, recipe: NormalizeRecipe | None = None) -> NormalizeResult:
    """Run the recipe's filters and deduplicators over ``pairs``; see the module docstring."""
    recipe = recipe or NormalizeRecipe.load(None)
    if recipe.executor == "ray":  # same ops on data-juicer's RayExecutor (composer_pipeline/pairs/normalize_ray.py)
        from composer_pipeline.pairs.normalize_ray import normalize_pairs_ray

        return normalize_pairs_ray(pairs, recipe)
    t0 = time.perf_counter()
    pairs = tables.conform(pairs, "dpo_pairs")
    n = pairs.num_rows
    pair_ids = pairs.column("pair_id").to_pylist()
    drop: dict[int, tuple[str, str, dict]] = {}

    texts = {k: _texts(pairs, k) for k in recipe.text_keys()}
    alive: list[int] = []
    for i in range(n):
        bad = [k for k, col in texts.items() if not isinstance(col[i], str)]
        if pair_ids[i] is None:
            bad.append("pair_id")
        if bad:
            drop[i] = ("invalid_input", f"{', '.join(bad)} missing or not a string", {"columns": bad})
        else:
            alive.append(i)

    if alive:  # nothing to normalize: skip data-juicer's import (~3 s) altogether
        with data_juicer_guard():
            _apply_ops(recipe, alive, texts, pair_ids, drop)
    alive = [i for i in range(n) if i not in drop]
    return _result(pairs, alive, drop, n, t0)


def _apply_ops(recipe: NormalizeRecipe, alive: list[int], texts: dict, pair_ids: list, drop: dict) -> None:
    """Run the recipe's ops in order over the surviving rows; every drop is recorded in ``drop``."""
    from data_juicer.ops.base_op import Deduplicator, Filter
    from data_juicer.ops.load import load_ops

    ops = load_ops([{name: {**args, "skip_op_error": False}} for name, args in recipe.process])
    for op in ops:
        if not isinstance(op, (Filter, Deduplicator)):
            raise ValueError(
                f"normalize recipe: {op._name} is a {type(op).__bases__[0].__name__}; only filters and "
                "deduplicators are supported (a mapper would change chosen_text but not the chosen action)"
            )
    for op in ops:
        if not alive:
            break
        key = op.text_key
        if isinstance(op, Filter):
            alive = _run_filter(op, key, alive, texts[key], drop)
        else:
            alive = _run_dedup(op, key, alive, texts[key], pair_ids, drop)


def _result(pairs: pa.Table, alive: list[int], drop: dict, n: int, t0: float) -> NormalizeResult:
    kept = pairs.take(pa.array(alive, pa.int64()))
    dropped_idx = sorted(drop)
    dropped = pairs.take(pa.array(dropped_idx, pa.int64()))
    dropped = dropped.append_column("drop_op", pa.array([drop[i][0] for i in dropped_idx], pa.string()))
    dropped = dropped.append_column("drop_reason", pa.array([drop[i][1] for i in dropped_idx], pa.string()))
    dropped = dropped.append_column(
        "drop_stats",
        pa.array([orjson.dumps(drop[i][2], option=orjson.OPT_SORT_KEYS).decode() for i in dropped_idx], pa.string()),
    )
    by_op: dict[str, int] = {}
    for i in dropped_idx:
        by_op[drop[i][0]] = by_op.get(drop[i][0], 0) + 1
    seconds = time.perf_counter() - t0
    stats = {
        "input": n,
        "kept": kept.num_rows,
        "dropped": len(dropped_idx),
        "dropped_by_op": by_op,
        "seconds": round(seconds, 4),
        "rows_per_s": round(n / seconds, 1) if seconds > 0 else None,
    }
    return NormalizeResult(
        kept=tables.conform(kept, "normalized_dpo_pairs"), dropped=tables.conform(dropped, "dropped_pairs"), stats=stats
    )
