"""data-juicer at arm's length, shared by both executors (normalize.py in-process, normalize_ray.py on Ray).

The guard every data-juicer call runs inside (:func:`data_juicer_guard`: no run-time installs,
stdout/stderr and loguru restored), the text each op reads (:func:`texts_for`, :func:`pair_text_column`)
and the result both return (:func:`build_result`: kept rows, dropped rows with op, reason and stats).
The recipe they run (:class:`~composer_pipeline.pairs.config.NormalizeRecipe`, ``recipes/normalize.yaml``)
is in ``config.py``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from composer_pipeline import tables

if TYPE_CHECKING:
    from loguru import Logger

# the guard patches process-wide state: one holder at a time
_GUARD_LOCK = threading.RLock()


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


def _handler_ids(logger: Logger) -> set[int]:
    """The ids of loguru's installed handlers."""
    # loguru has no public listing of its handlers, and its stubs do not declare the private `_core`
    return set(logger._core.handlers)  # type: ignore[attr-defined]  # noqa: SLF001


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    from loguru import logger

    saved_out, saved_err = sys.stdout, sys.stderr
    before = _handler_ids(logger)
    real_remove = logger.remove

    def _remove_only_new(handler_id=None):
        # data-juicer's blanket logger.remove(): spare the host's handlers
        if handler_id is None:
            for hid in _handler_ids(logger) - before:
                real_remove(hid)
        elif handler_id not in before:
            real_remove(handler_id)

    # data-juicer's blanket remove() is contained by swapping the method for the guard's lifetime
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
        # the method swapped above, put back
        logger.remove = real_remove  # type: ignore[method-assign]
        for hid in _handler_ids(logger) - before:
            real_remove(hid)
        sys.stdout, sys.stderr = saved_out, saved_err


def texts_for(pairs: pa.Table, key: str) -> list:
    if key == "pair_text":
        p, c, r = (pairs.column(k).to_pylist() for k in ("prompt", "chosen_text", "rejected_text"))
        return [
            None if (a is None or b is None or d is None) else f"{a}\n\x1e\n{b}\n\x1e\n{d}" for a, b, d in zip(p, c, r)
        ]
    return pairs.column(key).to_pylist()


def pair_text_column(pairs: pa.Table) -> list:
    """The dedup text of each pair (prompt, chosen_text, rejected_text joined), as the recipe sees it."""
    return texts_for(pairs, "pair_text")


def build_result(pairs: pa.Table, alive: list[int], drop: dict, n: int, t0: float) -> NormalizeResult:
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
