"""``composer-pipeline experiment read-before-edit``: does the pipeline's data make a better policy?

Runs :mod:`composer_pipeline.experiments.read_before_edit` (generated sessions -> ingest -> replay
against rule-following local teachers that disagree -> pairs/hints -> start policy -> arms and their
controls × N seeds -> held-out scores per state kind) at the sizes of a preset under
``recipes/experiments/read_before_edit/`` (``--recipe``; ``--quick`` and ``--model smollm2`` name one),
each explicit flag overriding its key. Prints one JSON line per arm × seed, then the
table with paired intervals; writes every finished cell, results, per-kind and per-state JSON lines,
curves and a plot under ``--out``. Resumable: a re-run skips finished cells.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from composer_pipeline.experiments.read_before_edit import ExperimentConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("experiment", help="controlled learning experiments on generated sessions")
    sub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    r = sub.add_parser("read-before-edit", help="does training teach Read before Edit on held-out states?")
    r.add_argument("--out", required=True, help="output directory (data stores, checkpoints, results, plots)")
    r.add_argument(
        "--recipe",
        default=None,
        metavar="FILE|NAME",
        help="the sizes: a preset of recipes/experiments/read_before_edit/ by name (default, quick, fmt, smollm2, "
        "smollm2_plan) or a YAML file; each flag given below overrides its key (default: default)",
    )
    r.add_argument("--seeds", type=int, default=None, help="seeds per arm (default 3; --quick: 1)")
    r.add_argument(
        "--only-seeds",
        default=None,
        help="comma-separated seeds this process runs, in this order (e.g. 4,3): a second process on the "
        "same --out shares the finished cells",
    )
    r.add_argument("--steps", type=int, default=None, help="trainer steps per arm (default 60; --quick: 20)")
    r.add_argument(
        "--model",
        default=None,
        help="tiny | smollm2 (SmolLM2-135M-Instruct at CPU sizes: "
        "the smollm2 preset) | local:smollm2-135m-instruct (the full sizes) | a model path (default tiny)",
    )
    r.add_argument(
        "--quick",
        action="store_true",
        help="tiny model, 1 seed, small sizes (<= 10 min on 2 CPU cores): the quick preset",
    )
    r.add_argument(
        "--arms",
        default=None,
        help="comma-separated subset of start,grpo,grpo_shuffled,sdpo,dpo,nll,"
        "dpo_shuffled,all,nll_all,dpo_differing,dpo_first,dpop,dpop_first (the controls: nll = the NLL term alone, dpo_shuffled = "
        "labels swapped at random, grpo_shuffled = a seeded prompt order, nll_all = the NLL on the consensus at every "
        "task state; dpo_differing / dpo_first: the preference term over the tokens where the sides differ / the "
        "first such token; dpop: DPO-Positive, the chosen answer kept at or above the start's likelihood; dpop_first: "
        "DPOP with the margin on the first differing token)",
    )
    r.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="stop cleanly before the next arm × seed cell once this many minutes are spent; every finished "
        "cell is kept under --out and a re-run with the same settings skips it",
    )
    r.add_argument("--eval-every", type=int, default=None, help="probe the held-out states every N trainer steps")
    r.add_argument("--train-sessions", type=int, default=None)
    r.add_argument("--heldout-sessions", type=int, default=None)
    r.add_argument("--sft-steps", type=int, default=None, help="steps fitting the start policy to the agents")
    r.add_argument(
        "--pretrain-steps",
        type=int,
        default=None,
        help="--model tiny: steps training the tiny base model from scratch on generated sessions",
    )
    r.add_argument("--pretrain-sessions", type=int, default=None, help="--model tiny: sessions the base model reads")
    r.add_argument("--lora", action="store_true", help="train LoRA adapters in the arms (large models on CPU)")
    r.add_argument(
        "--hint-teacher",
        choices=["initial", "current"],
        default=None,
        help="the hint channel's teacher: the frozen start policy (default) or the policy being trained",
    )
    r.add_argument(
        "--dpo-sft-weight",
        type=float,
        default=None,
        help="weight of the NLL term on chosen answers beside the DPO loss (default 1.0; 0 = plain DPO)",
    )
    r.add_argument(
        "--preference-tokens",
        choices=["all", "differing", "first_differing"],
        default=None,
        help="the tokens the preference term sums in the dpo, dpo_shuffled and all arms (default: the recipe's "
        "dpo.preference_tokens)",
    )
    r.add_argument(
        "--dpo-variant",
        choices=["dpo", "simpo", "dpop"],
        default=None,
        help="the preference loss in the dpo, dpo_shuffled and all arms (default: the recipe's dpo.variant; "
        "dpop: DPO-Positive, dpo.dpop_lambda)",
    )
    r.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default=None,
        help="where models train and probes generate (default cpu: fp32, as before the flag; cuda: fp32 weights "
        "with the trainer's bf16 autocast, refused at once where torch sees no CUDA device; auto: cuda if seen)",
    )
    r.add_argument(
        "--action-order",
        choices=["sorted", "name_first"],
        default=None,
        help="tool-call key order of every completion text in the chain (render.action_order; default sorted): "
        "name_first puts the tool name before the arguments",
    )
    r.set_defaults(func=run)


def experiment_config(args: argparse.Namespace) -> ExperimentConfig:
    """The experiment's settings: the preset (``--recipe``, or ``--quick`` / ``--model smollm2``, else
    ``default``) with every flag given on top; the ranges the flags must keep checked."""
    from pathlib import Path

    from composer_pipeline.experiments.read_before_edit import load_config

    kw = {
        "seeds": args.seeds,
        "steps": args.steps,
        "model": args.model,
        "train_sessions": args.train_sessions,
        "heldout_sessions": args.heldout_sessions,
        "sft_steps": args.sft_steps,
        "pretrain_steps": args.pretrain_steps,
        "pretrain_sessions": args.pretrain_sessions,
        "hint_teacher": args.hint_teacher,
        "dpo_sft_weight": args.dpo_sft_weight,
        "budget_minutes": args.budget_minutes,
        "eval_every": args.eval_every,
        "preference_tokens": args.preference_tokens,
        "dpo_variant": args.dpo_variant,
        "lora": True if args.lora else None,
        "device": args.device,
        "action_order": args.action_order,
    }
    if args.arms:
        kw["arms"] = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if args.only_seeds:
        kw["only_seeds"] = tuple(int(x) for x in args.only_seeds.split(",") if x.strip())
    preset = "quick" if args.quick else "smollm2" if args.model == "smollm2" else None
    if preset == "smollm2":
        kw["model"] = None
    if args.recipe and preset:
        flag = "--quick" if args.quick else "--model smollm2"
        raise ValueError(f"{flag} is the {preset} preset: give it or --recipe {args.recipe}, not both")
    cfg = load_config(args.recipe or preset or "default", Path(args.out), **kw)
    if cfg.budget_minutes is not None and cfg.budget_minutes <= 0:
        raise ValueError("--budget-minutes must be > 0")
    for name in (
        "seeds",
        "steps",
        "train_sessions",
        "heldout_sessions",
        "sft_steps",
        "pretrain_steps",
        "pretrain_sessions",
        "eval_every",
    ):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    return cfg


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from composer_pipeline.experiments.read_before_edit import run_experiment

    cfg = experiment_config(args)
    res = run_experiment(cfg)
    print(res["table"])
    if res["stopped"]:
        print(
            f"stopped by --budget-minutes {cfg.budget_minutes}: {len(res['results'])} cells done; "
            "run the same command again to resume"
        )
    print(
        f"plots: {Path(res['out']) / 'curves.png'}  results: {Path(res['out']) / 'results.jsonl'}  ({res['seconds']:.0f} s)"
    )
    return 0
