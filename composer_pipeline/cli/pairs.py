"""``composer-pipeline pairs``: build DPO pairs from replays and normalise them, without Dagster.

Reads ``trace_states``/``trace_messages`` (from ``ingest``) and ``replays`` (from ``replay``),
writes ``dpo_pairs``, ``pairs`` (= normalized_dpo_pairs), ``positives`` and ``dropped_pairs``
Parquet into ``--out`` (a directory or ``s3://`` prefix) and prints one JSON summary line.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("pairs", help="teacher-consensus DPO pairs + data-juicer normalization")
    p.add_argument("--replays", required=True, help="dir or s3:// prefix holding replays.parquet")
    p.add_argument("--states", required=True, help="dir or s3:// prefix holding trace_states/trace_messages")
    p.add_argument("--out", required=True, help="dir or s3:// prefix to write pair tables into")
    p.add_argument(
        "--teachers",
        default=None,
        help="the teachers recipe the replay used: which entries are one model (base_url + model) and "
        "which sample (temperature > 0); without it each distinct model field is one greedy model",
    )
    p.add_argument("--recipe", default=None, help="pairs recipe (default recipes/pairs.yaml)")
    p.add_argument("--normalize-recipe", default=None, help="data-juicer recipe (default recipes/normalize.yaml)")
    p.add_argument(
        "--ingest-recipe", default=None, help="render options from this ingest recipe (default: render defaults)"
    )
    p.set_defaults(func=run)


def _render_opts(path: str | None):
    from composer_pipeline import render

    return render.RenderOptions.from_recipe(path)


def _kinds(table) -> dict[str, int]:
    from collections import Counter

    return dict(Counter(table.column("agreement_kind").to_pylist())) if table.num_rows else {}


def run(args: argparse.Namespace) -> int:
    import orjson
    import pyarrow as pa
    from loguru import logger

    from composer_pipeline import tables
    from composer_pipeline.pairs.build import build_pairs
    from composer_pipeline.pairs.config import NormalizeRecipe, PairRecipe
    from composer_pipeline.pairs.normalize import normalize_pairs
    from composer_pipeline.store import Store
    from composer_pipeline.teachers.config import load_teachers

    logger.remove()
    logger.add(__import__("sys").stderr, level="WARNING")
    recipe = PairRecipe.load(args.recipe)
    nrecipe = NormalizeRecipe.load(args.normalize_recipe)
    states_store, replays_store, out = Store(args.states), Store(args.replays), Store(args.out)
    if not states_store.exists("trace_states"):
        raise FileNotFoundError(f"no trace_states under {args.states} (run `composer-pipeline ingest` first)")
    if not states_store.exists("trace_messages"):
        raise FileNotFoundError(f"no trace_messages under {args.states}: prompts cannot be rendered without them")
    if not replays_store.exists("teacher_replays"):
        raise FileNotFoundError(f"no replays.parquet / teacher_replays under {args.replays} (run `replay` first)")
    res = build_pairs(
        states_store.read_table("trace_states"),
        states_store.read_table("trace_messages"),
        replays_store.read_table("teacher_replays"),
        recipe,
        _render_opts(args.ingest_recipe),
        teachers=load_teachers(args.teachers) if args.teachers else None,
    )
    norm = normalize_pairs(res.pairs, nrecipe)
    out.write_table("dpo_pairs", res.pairs)
    out.write_table(tables.cli_file_name("normalized_dpo_pairs"), norm.kept)  # pairs.parquet (tables.FILE_ALIASES)
    out.write_table(tables.cli_file_name("agreement_positives"), res.positives)  # positives.parquet
    dropped = pa.concat_tables([res.dropped, tables.conform(norm.dropped, "dropped_pairs")])  # build's drops first
    out.write_table("dropped_pairs", dropped)
    summary = {
        "pairs": norm.kept.num_rows,
        "positives": res.positives.num_rows,
        "built": res.pairs.num_rows,
        "dropped": dropped.num_rows,
        "dropped_by_op": {
            **({"pairs.build": res.dropped.num_rows} if res.dropped.num_rows else {}),
            **norm.stats["dropped_by_op"],
        },
        "pairs_by_agreement_kind": _kinds(norm.kept),
        "votes_from": args.teachers or "model field of each replay row (no --teachers)",
        "normalize_seconds": norm.stats["seconds"],
        "build": res.stats,
        "out": out.root,
    }
    print(orjson.dumps(summary).decode())
    return 0
