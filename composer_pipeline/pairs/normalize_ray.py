"""Normalise DPO pairs on Ray: data-juicer's ``RayExecutor`` running the same recipe ops.

In:  a ``dpo_pairs`` table and a :class:`NormalizeRecipe` whose ``executor`` is ``ray`` (set
     ``executor_type: ray`` and ``ray_address`` in ``recipes/normalize.yaml``; ``ray_address: local``
     starts an in-process Ray, ``auto`` joins the cluster of this node, ``ray://host:10001`` a
     remote one).
Out: the same :class:`NormalizeResult` as :func:`normalize_pairs` (``kept``, ``dropped`` with
     ``drop_op``/``drop_reason``/``drop_stats``, ``stats``), so the Dagster asset does not change.

How it runs: only ``pair_id`` and the text columns the ops name travel through Ray (JSONL in a
scratch dir, which on a cluster must be a path every Ray node can read: set ``work_dir``);
every other column is taken back from the input table by ``pair_id``. One ``RayExecutor`` pass per
op, in recipe order, so each op gets its own stats (data-juicer's cross-key stats collision exists
on Ray too) and every dropped row is attributed to the op that dropped it. ``document_deduplicator``
is not supported by data-juicer on Ray: it is run as ``ray_document_deduplicator`` with the same
``lowercase``/``ignore_non_character`` arguments.

Deliberately simplified: a pass per op re-reads the survivors (fine for the recipe's 7 ops; fuse
filters on one key yourself for very large corpora); which of two exact duplicates survives on
Ray follows Ray's block order, not necessarily the first occurrence; per-row stats of a filter
drop are not collected (``drop_stats`` carries the op's bounds only).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import yaml

from composer_pipeline import tables
from composer_pipeline.ids import with_partition_key
from composer_pipeline.pairs.config import NormalizeRecipe
from composer_pipeline.pairs.datajuicer import (
    NormalizeResult,
    build_result,
    data_juicer_guard,
    pair_text_column,
)

# data-juicer op name on the default executor -> its Ray counterpart (args it accepts)
RAY_OP_NAMES = {"document_deduplicator": "ray_document_deduplicator"}
_RAY_DEDUP_ARGS = {"text_key", "lowercase", "ignore_non_character", "backend", "redis_address"}


def ray_process(recipe: NormalizeRecipe) -> list[dict[str, dict[str, Any]]]:
    """The recipe's ops as a data-juicer ``process`` list for ``RayExecutor`` (Ray op names)."""
    out = []
    for name, args in recipe.process:
        if name in RAY_OP_NAMES:
            name = RAY_OP_NAMES[name]
            args = {k: v for k, v in args.items() if k in _RAY_DEDUP_ARGS}
        out.append({name: {**args, "skip_op_error": False}})
    return out


def ray_executor_config(
    recipe: NormalizeRecipe, *, dataset_path: str, export_path: str, work_dir: str, process: list[dict] | None = None
) -> dict[str, Any]:
    """A data-juicer config (as a dict, YAML-ready) that selects ``RayExecutor`` for ``process``."""
    process = ray_process(recipe) if process is None else process
    (first,) = process[0].values()
    return {
        "project_name": "composer-dpo-normalize-ray",
        "executor_type": "ray",
        "ray_address": recipe.ray_address or "auto",
        "dataset_path": dataset_path,
        "export_path": export_path,
        "work_dir": work_dir,
        "text_keys": first.get("text_key", recipe.default_text_key),
        "skip_op_error": False,
        "np": 1,
        "op_fusion": False,
        "process": process,
    }


def load_ray_config(config: dict[str, Any], cfg_path: Path):
    """Parse ``config`` with data-juicer's own parser (no stdout hijack, no log folder)."""
    from data_juicer.config import init_configs

    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return init_configs(args=["--config", str(cfg_path)], load_configs_only=True)


def normalize_pairs_ray(pairs: pa.Table, recipe: NormalizeRecipe) -> NormalizeResult:
    """Run ``recipe`` through data-juicer's ``RayExecutor``; same result shape as ``normalize_pairs``."""
    t0 = time.perf_counter()
    # (pairs built before the column: filled)
    pairs = tables.conform(with_partition_key(pairs), "dpo_pairs")
    n = pairs.num_rows
    pair_ids = pairs.column("pair_id").to_pylist()
    keys = recipe.text_keys()
    cols = {k: (pair_text_column(pairs) if k == "pair_text" else pairs.column(k).to_pylist()) for k in keys}
    drop: dict[int, tuple[str, str, dict]] = {}
    alive: list[int] = []
    seen: set = set()
    for i in range(n):
        bad = [k for k, col in cols.items() if not isinstance(col[i], str)]
        if pair_ids[i] is None:
            bad.append("pair_id")
        elif pair_ids[i] in seen:  # rows are matched back by pair_id
            drop[i] = ("invalid_input", "duplicate pair_id", {"columns": ["pair_id"]})
            continue
        if bad:
            drop[i] = ("invalid_input", f"{', '.join(bad)} missing or not a string", {"columns": bad})
        else:
            seen.add(pair_ids[i])
            alive.append(i)
    if alive:
        scratch = Path(recipe.ray_work_dir) if recipe.ray_work_dir else None
        if scratch:
            scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="dj-ray-", dir=scratch) as tmp, data_juicer_guard():
            alive = _run_passes(recipe, alive, pair_ids, cols, drop, Path(tmp))
    alive = [i for i in range(n) if i not in drop]
    res = build_result(pairs, alive, drop, n, t0)
    res.stats["executor"] = "ray"
    res.stats["ray_address"] = recipe.ray_address
    return res


def _run_passes(recipe, alive: list[int], pair_ids: list, cols: dict, drop: dict, tmp: Path) -> list[int]:
    from data_juicer.core.executor.ray_executor import RayExecutor

    for n, (op, (name, args)) in enumerate(zip(ray_process(recipe), recipe.process)):
        if not alive:
            break
        data = tmp / f"pass{n}_in.jsonl"
        data.write_bytes(
            b"".join(orjson.dumps({"pair_id": pair_ids[i], **{k: cols[k][i] for k in cols}}) + b"\n" for i in alive)
        )
        config = ray_executor_config(
            recipe,
            dataset_path=str(data),
            export_path=str(tmp / f"pass{n}_out.jsonl"),
            work_dir=str(tmp / f"work{n}"),
            process=[op],
        )
        cfg = load_ray_config(config, tmp / f"pass{n}.yaml")
        dataset = RayExecutor(cfg).run(skip_export=True)
        survivors = {r["pair_id"] for r in dataset.data.select_columns(["pair_id"]).take_all()}
        reason = "duplicate" if "deduplicator" in name else f"outside {name} bounds on {args['text_key']}"
        bounds = {k: v for k, v in args.items() if k.startswith(("min_", "max_"))}
        for i in alive:
            if pair_ids[i] not in survivors:
                drop[i] = (name, reason, {"text_key": args["text_key"], **bounds, "executor": "ray"})
        alive = [i for i in alive if pair_ids[i] in survivors]
    return alive
