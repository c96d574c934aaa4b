"""The read-before-edit experiment's data: generated sessions -> ingest -> replay -> pairs.

In:  an :class:`~.config.ExperimentConfig` (how many train and held-out sessions) and a work directory.
Out: under it, a train store (states, messages, teacher replays, pairs, positives), a held-out store, the
     error-site view the hint arm reads, and ``info.json`` (the stores and the counts of each stage); a
     run with the same sizes reuses them.

Every stage is the pipeline's own: the normal ingest, a priced, cached and ledgered replay over HTTP
against rule-following teachers that disagree (:mod:`composer_pipeline.experiments.rule_teacher`),
``build_pairs`` and ``normalize_pairs`` with the repo's recipes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from composer_pipeline.actions import Action
from composer_pipeline.experiments.read_before_edit.config import REPO, TEACHERS, ExperimentConfig
from composer_pipeline.experiments.rule_teacher import MODEL_PREFIX, RuleTeacherServer, rule_action
from composer_pipeline.experiments.sessions import HELDOUT_SEED, ingest_sessions, write_sessions
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from composer_pipeline.train.config import HintTemplates


def _task_state_ids(store_root: Path) -> set[str]:
    """States whose prompt holds a file request (the rule has an answer there)."""
    from composer_pipeline.train.data import load_train_data

    data = load_train_data(str(store_root), heldout_fraction=0.0, hints=HintTemplates())
    return {p.state_id for p in data.prompts if rule_action(p.messages) is not None}


def build_data(work: Path, cfg: ExperimentConfig) -> dict[str, Any]:
    """Sessions -> ingest -> replay (rule teachers over HTTP) -> pairs. Returns the store roots and counts
    (reused from ``info.json`` when a run with the same settings built them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from composer_pipeline import render, tables
    from composer_pipeline.ledger import Ledger
    from composer_pipeline.pairs.build import build_pairs
    from composer_pipeline.pairs.config import NormalizeRecipe, PairRecipe
    from composer_pipeline.pairs.normalize import normalize_pairs
    from composer_pipeline.replay.report import cli_legacy_keys
    from composer_pipeline.replay.run import ReplayRun
    from composer_pipeline.store import Store

    info_path = work / "info.json"
    sizes = {
        "train_sessions": cfg.train_sessions,
        "heldout_sessions": cfg.heldout_sessions,
        "heldout_seed": HELDOUT_SEED,
        "teachers": TEACHERS,
    }
    if cfg.action_order != "sorted":
        sizes["action_order"] = cfg.action_order
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("sizes") == sizes:
            return _resolve_stores(info, work)
    train_plans = write_sessions(work / "sessions" / "train", cfg.train_sessions, "train", seed=0)
    # a seed range no design round has looked at (runs 1-3 used seed 0 for both splits)
    held_plans = write_sessions(work / "sessions" / "heldout", cfg.heldout_sessions, "heldout", seed=HELDOUT_SEED)
    train_root, heldout_root = work / "train_store", work / "heldout_store"
    counts = {
        "train": ingest_sessions(work / "sessions" / "train", train_root),
        "heldout": ingest_sessions(work / "sessions" / "heldout", heldout_root),
    }
    store = Store(str(train_root))
    states, messages = store.read_table("trace_states"), store.read_table("trace_messages")
    task = _task_state_ids(train_root)
    task_states = states.filter(pc.is_in(states["state_id"], value_set=pa.array(sorted(task))))
    with RuleTeacherServer() as srv:
        cfg_t = parse_teachers(
            {
                "ceiling_usd": 1.0,
                "teachers": [
                    # each variant stands in for a distinct strong API teacher, so each names its own model: the
                    # pair builder counts distinct models (base_url + model) as votes, not entry names
                    {
                        "name": n,
                        "base_url": srv.url,
                        "model": MODEL_PREFIX + v,
                        "api_key_env": None,
                        "input_usd_per_mtok": 0.01,
                        "output_usd_per_mtok": 0.02,
                        "budget_usd": 1.0,
                        "max_concurrency": 4,
                        "max_tokens": 256,
                        "temperature": 0.0,
                        "timeout_s": 30,
                        "max_retries": 2,
                    }
                    for n, v in TEACHERS.items()
                ],
            },
            "experiment",
        )
        opts = render.RenderOptions(action_order=cfg.action_order)
        ledger, cache = Ledger(work / "ledger.sqlite"), ResponseCache(work / "teacher_cache")
        run = ReplayRun.prepare(task_states, messages, cfg_t, opts)
        plan = run.plan(cache, ledger)
        if not plan.fits:
            raise RuntimeError(f"cost plan does not fit: {plan.reasons}")
        res = run.replay({n: None for n in TEACHERS}, cache=cache, ledger=ledger, run_id="read-before-edit")
        calls = srv.calls
    store.write_table("teacher_replays", res.table)
    pairs = build_pairs(
        task_states, messages, res.table, PairRecipe.load(REPO / "recipes" / "pairs.yaml"), opts, teachers=cfg_t
    )
    norm = normalize_pairs(pairs.pairs, NormalizeRecipe.load(REPO / "recipes" / "normalize.yaml"))
    store.write_table("dpo_pairs", pairs.pairs)
    store.write_table("pairs", norm.kept)
    store.write_table("positives", pairs.positives)
    store.write_table("dropped_pairs", pa.concat_tables([pairs.dropped, tables.conform(norm.dropped, "dropped_pairs")]))
    # the hint arm reads error sites only: a view of the same tables restricted to them, so that every
    # step's batch holds one (a step without any would have nothing to distill)
    err_ids = pa.array(sorted(set(states.filter(pc.field("has_error")).column("state_id").to_pylist())))
    hint_root = work / "error_site_store"
    hint_store = Store(str(hint_root))
    for name in ("trace_states", "pairs", "positives"):
        t = store.read_table(name)
        hint_store.write_table(name, t.filter(pc.is_in(t["state_id"], value_set=err_ids)))
    hint_store.write_table("trace_messages", messages)
    st = pairs.stats
    # info.json keeps the names earlier runs wrote
    replay_counts = {**res.summary, **cli_legacy_keys(res.summary)}
    info = {
        "sizes": sizes,
        # relative to the data dir, so a run resumes from any working directory
        "train_store": train_root.name,
        "heldout_store": heldout_root.name,
        "error_site_store": hint_root.name,
        "error_sites": len(err_ids),
        "ingest": counts,
        "edit_first_sessions": sum(p.edit_first for p in train_plans),
        "train_sessions": len(train_plans),
        "detour_sessions": {
            "train": sum(p.detour is not None for p in train_plans),
            "heldout": sum(p.detour is not None for p in held_plans),
        },
        "task_states": len(task),
        "teacher_calls_http": calls,
        "replay": {k: replay_counts[k] for k in ("calls", "cache_hits", "answered", "failed", "total_spend")},
        "pairs": norm.kept.num_rows,
        "pair_kinds": _pair_kinds(norm.kept),
        "positives": pairs.positives.num_rows,
        "dropped": norm.dropped.num_rows + pairs.dropped.num_rows,
        # how the teachers agreed: states with a cross-model consensus, tied, with none; answers of one
        # model asked twice (counted once)
        "consensus": {
            "cross_model": st["states_cross_model"],
            "self_consistency": st["states_self_consistency"],
            "tied": st["states_tied"],
            "no_consensus": st["states_no_consensus"],
            "greedy_duplicates": st["answers_greedy_duplicates"],
            "agreeing_models": _agreeing_models(pairs.pairs, pairs.positives),
        },
    }
    info_path.write_text(json.dumps(info, indent=1))
    return _resolve_stores(info, work)


_STORES = ("train_store", "heldout_store", "error_site_store")


def _resolve_stores(info: dict[str, Any], work: Path) -> dict[str, Any]:
    """``info.json``'s store paths as paths to open: relative ones are under ``work`` (runs made
    before 2026-11-26 wrote them relative to the working directory they ran in: kept when found there)."""
    out = dict(info)
    for k in _STORES:
        p = Path(info[k])
        out[k] = str(p if p.is_absolute() or (not (work / p).is_dir() and p.is_dir()) else work / p)
    return out


def _agreeing_models(*tables) -> dict[str, int]:
    """Rows per "k of n models" (the consensus' size among the distinct models that answered)."""
    out: dict[str, int] = {}
    for t in tables:
        for k, n in zip(t.column("n_models_agreeing").to_pylist(), t.column("n_models").to_pylist()):
            out[f"{k} of {n}"] = out.get(f"{k} of {n}", 0) + 1
    return dict(sorted(out.items()))


def _pair_kinds(pairs) -> dict[str, int]:
    """How many pairs prefer which tool over which (``"Read over Edit"``): both directions are needed,
    or DPO learns "always X" instead of the rule."""

    def tool(js: str) -> str:
        a = Action.from_json(js)
        return a.tool_calls[0].name if a.tool_calls else "text"

    kinds: dict[str, int] = {}
    for c, r in zip(pairs.column("chosen").to_pylist(), pairs.column("rejected").to_pylist()):
        k = f"{tool(c)} over {tool(r)}"
        kinds[k] = kinds.get(k, 0) + 1
    return dict(sorted(kinds.items()))
