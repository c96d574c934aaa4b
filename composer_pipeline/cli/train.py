"""``composer-pipeline train``: the three-channel trainer without Dagster; ``train eval``: held-out metrics.

    composer-pipeline train --data DIR --recipe recipes/train.yaml [--model PATH] [--steps N] --out DIR
                            [--lighthouse http://HOST:PORT --group G]   (DiLoCo on many hosts)
    composer-pipeline train eval --model PATH --data DIR [--recipe FILE] [--baseline PATH] [--json] [--tolerance X]

``--data`` is any Store root (local dir, s3://, flat CLI layout or the Dagster partitioned layout).
Training prints one JSON line per step (``step``, ``grpo``, ``sdpo``, ``dpo``, ``total``, ``off``) and a
final ``{"checkpoint": ...}`` line. With ``diloco.replica_groups`` ≥ 2 in the recipe it trains replica groups
(:mod:`composer_pipeline.train.diloco_launch`): step lines also carry ``group``, ``outer_step``,
``replica_groups_live``. ``eval`` prints one JSON object (and, with ``--baseline``, the
regression verdict of the model against the baseline checkpoint); with ``--json`` the document of
:func:`composer_pipeline.train.evaluate.report` (every metric as ``{value, n}``, ``action_parse_rate`` among them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_RECIPE = "recipes/train.yaml"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a policy on the pipeline's tables (GRPO + SDPO + DPO)")
    p.add_argument("mode", nargs="?", choices=["eval"], help="`eval`: held-out metrics of --model instead of training")
    p.add_argument("--data", required=True, help="Store root holding pairs/positives (and trace_states)")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"trainer recipe YAML (default {DEFAULT_RECIPE})")
    p.add_argument("--model", default=None, help="model name/path, 'tiny' or 'local:NAME' (overrides the recipe)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides optim.steps)")
    p.add_argument("--out", type=Path, default=None, help="output dir (checkpoint goes to OUT/checkpoint)")
    p.add_argument("--baseline", default=None, help="eval: also evaluate this checkpoint and compare")
    p.add_argument("--lighthouse", default=None, help="DiLoCo on many hosts: the lighthouse this group joins")
    p.add_argument("--group", type=int, default=None, help="DiLoCo on many hosts: this host's replica group id")
    p.add_argument(
        "--json",
        action="store_true",
        help="eval: one JSON document: every held-out metric as {value, n} for --model and --baseline "
        "(action_parse_rate among them, its failures by reason), the comparison and its one-line verdict",
    )
    p.add_argument(
        "--tolerance", type=float, default=0.0, help="eval: a drop up to this much is not a regression (default 0)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from composer_pipeline.train.config import TrainRecipe

    recipe = TrainRecipe.load(args.recipe)
    if args.mode == "eval":
        from composer_pipeline.train.evaluate import compare, evaluate_policy, report

        if not args.model:
            raise ValueError("train eval needs --model PATH")
        new = evaluate_policy(args.model, args.data, recipe)
        base = evaluate_policy(args.baseline, args.data, recipe) if args.baseline else None
        if args.json:
            doc = report(new, base, tolerance=args.tolerance, min_rows=recipe.eval.min_rows_to_measure)
            print(json.dumps(doc, default=str))
            return 0
        result = {"eval": new}
        if base is not None:
            result["baseline"] = base
            result["verdict"] = compare(base, new, tolerance=args.tolerance)
        print(json.dumps(result, default=str))
        return 0
    if args.out is None:
        raise ValueError("train needs --out DIR")
    from composer_pipeline.train.diloco_launch import train

    def on_step(rec: dict) -> None:
        replicas = {k: rec[k] for k in ("group", "outer_step", "replica_groups_live") if k in rec}
        print(
            json.dumps(
                {k: rec[k] for k in ("step", "grpo", "sdpo", "dpo", "total", "off")}
                | {"off_reasons": rec["off_reasons"]}
                | replicas
            ),
            flush=True,
        )

    res = train(
        args.data,
        recipe,
        model=args.model,
        steps=args.steps,
        out_dir=args.out,
        on_step=on_step,
        lighthouse=args.lighthouse,
        group=args.group,
    )
    print(
        json.dumps(
            {
                "checkpoint": str(res.checkpoint),
                "final": res.metrics["final"],
                "plots": {k: str(v) for k, v in res.plots.items()},
            }
        )
    )
    sys.stdout.flush()
    return 0
