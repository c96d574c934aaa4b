"""``composer-pipeline replay``: ask every teacher for the next action at every trace state, without Dagster.

Reads ``trace_states`` + ``trace_messages`` from ``--states`` (what ``ingest`` wrote), writes
``replays.parquet`` (table ``teacher_replays``, one row per state × teacher: the name ``sql``, ``show``,
``lineage`` and Dagster use; the file keeps its short name for scripts, ``tables.FILE_ALIASES``) and ``cost_plan.parquet``
into ``--out`` and prints one JSON summary line: :func:`~composer_pipeline.replay.report.replay_summary`
(the same dict the ``teacher_replays`` asset shows as ``summary``), the older names of its numbers
(``calls``, ``cache_hits``, ``total_spend``, ...: ``run_report.CLI_LEGACY_KEYS``), ``run_id``, ``out``,
``ledger``, ``cache`` and ``predicted_vs_billed``. Rendering, pricing, pre-flight and sending go through
:class:`~composer_pipeline.replay.front.ReplayFront`, as in the assets. Before any call: missing API-key variables, a key with a
control character inside (surrounding whitespace is stripped), unknown hosts, an unwritable ``--out`` and
a teacher name the ledger knows with another endpoint, model or price exit 2 naming them. A PostgreSQL
ledger lost mid-run is retried for ``ledger_outage_s``, then exit 2. Exit 1 when a teacher was cut off (invalid
responses) or no call was answered; 143/130 after SIGTERM/SIGINT (the ledger run is closed first). API keys are read from the environment variables the
teachers YAML names. The ledger and response cache default to those of the Dagster assets
(:mod:`composer_pipeline.home`: ``$COMPOSER_PIPELINE_HOME``, else ``~/.cache/composer-pipeline``), so
budgets hold across runs and a re-run or a Dagster run of the same states pays for nothing twice.
``--mode batch`` sends each teacher's outstanding calls as provider batches (:mod:`composer_pipeline.replay.batch`):
with ``--no-wait`` it returns after submitting (exit 0, the pending calls named in the summary's ``batch``), and
a later run with the same arguments collects; killed at any point, a run with the same arguments goes on with
the live batches and submits nothing twice.
"""

from __future__ import annotations

import argparse
import sys


def usd_amount(text: str) -> float:
    """A USD amount on the command line: a finite number >= 0 (``nan``, ``inf`` and negatives are refused
    at parsing, as the recipes' settings layer refuses them; a nan ceiling compares false with every cost)."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an amount in USD: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite amount in USD >= 0, got {text!r}")
    return v


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="replay trace states to every teacher (budgets, cache, retries)")
    p.add_argument("--states", required=True, help="dir or s3:// prefix holding trace_states + trace_messages")
    p.add_argument("--teachers", required=True, help="teachers YAML (e.g. recipes/demo_teachers.yaml)")
    p.add_argument(
        "--out",
        required=True,
        help="dir or s3:// prefix to write replays.parquet (table teacher_replays) and cost_plan.parquet into",
    )
    p.add_argument(
        "--ledger",
        default=None,
        help="budget ledger URL: a file path (SQLite) or postgresql://user@host/db "
        "(default $COMPOSER_LEDGER_URL, else $COMPOSER_PIPELINE_HOME/ledger.sqlite)",
    )
    p.add_argument("--cache", default=None, help="response cache dir (default $COMPOSER_PIPELINE_HOME/teacher_cache)")
    p.add_argument(
        "--ceiling-usd",
        type=usd_amount,
        default=None,
        help="override the YAML's ceiling_usd for this run (a finite amount >= 0)",
    )
    p.add_argument("--run-id", default=None, help="id of this run in the ledger (default: a fresh uuid)")
    p.add_argument(
        "--ingest-recipe", default=None, help="render options from this ingest recipe (default: render defaults)"
    )
    p.add_argument("--plan-only", action="store_true", help="print the cost plan and stop (no calls)")
    p.add_argument(
        "--pairs-recipe",
        default=None,
        help="pairs YAML whose notion of agreement decides the teachers recipe's escalation (default: recipes/pairs.yaml)",
    )
    p.add_argument(
        "--mode",
        choices=("sync", "batch"),
        default=None,
        help="override the YAML's mode: sync (answered now) or batch (provider batch APIs at batch_price_factor)",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="mode batch: return once the batches are submitted (and ended ones collected); a later run with the "
        "same arguments collects the rest",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import os
    import uuid
    from pathlib import Path

    import orjson

    from composer_pipeline import render, tables
    from composer_pipeline.home import default_cache_dir
    from composer_pipeline.ledger import open_ledger
    from composer_pipeline.pairs.config import PairRecipe
    from composer_pipeline.replay.front import ReplayFront, plan_summary
    from composer_pipeline.replay.preflight import PreflightError, check_writable
    from composer_pipeline.replay.report import cli_legacy_keys
    from composer_pipeline.store import Store
    from composer_pipeline.teachers.cache import ResponseCache
    from composer_pipeline.teachers.config import load_teachers

    cfg = load_teachers(args.teachers)
    if args.ceiling_usd is not None:
        cfg = dataclasses.replace(cfg, ceiling_usd=args.ceiling_usd)
    if args.mode is not None:
        cfg = dataclasses.replace(cfg, mode=args.mode)
    src, out = Store(args.states), Store(args.out)
    if not src.exists("trace_states"):
        raise FileNotFoundError(f"no trace_states under {args.states} (run `composer-pipeline ingest` first)")
    states, messages = src.read_table("trace_states"), src.read_table("trace_messages")
    ledger = open_ledger(args.ledger)
    cache_dir = Path(args.cache or default_cache_dir()).expanduser()
    front = ReplayFront(cfg, ResponseCache(cache_dir), ledger, PairRecipe.load(args.pairs_recipe))

    replay_run = front.prepare(states, messages, render.RenderOptions.from_recipe(args.ingest_recipe))
    plan = front.plan(replay_run)
    env_keys = {t.name: (os.environ.get(t.api_key_env) if t.api_key_env else None) for t in cfg.teachers}
    # before anything is sent: keys, hosts, and where the answers go
    keys = front.keys(plan, env_keys, plan_only=args.plan_only, writable={} if out.is_remote else {"--out": args.out})
    try:
        check_writable(cache_dir, "response cache")
    # paid answers are stored in the ledger first: the run can still go on
    except PreflightError as e:
        print(f"warning: {e}; answers are kept in the ledger ({ledger.label}) and reach the output", file=sys.stderr)
    out.write_table("cost_plan", plan.table)
    if not plan.fits:
        for reason in plan.reasons:
            print(f"cost plan: {reason}", file=sys.stderr)
    if args.plan_only:
        print(orjson.dumps(plan_summary(plan)).decode())
        return 0

    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if tty and (done == total or done % 10 == 0):
            print(f"\rteacher calls {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)

    run_id = args.run_id or f"cli-{uuid.uuid4().hex[:12]}"
    outcome = front.replay(replay_run, plan, keys, run_id, progress, wait=not args.no_wait)
    res = outcome.result
    path = out.write_table(tables.cli_file_name("teacher_replays"), res.table)  # replays.parquet (tables.FILE_ALIASES)
    # the one replay summary (run_report.replay_summary, also the asset's `summary`), the names this command
    # printed before it (run_report.CLI_LEGACY_KEYS), and where this run wrote
    summary = {
        **res.summary,
        **cli_legacy_keys(res.summary),
        "run_id": run_id,
        "out": out.url(f"{tables.cli_file_name('teacher_replays')}.parquet") if out.is_remote else path,
        "ledger": ledger.label,
        "cache": str(cache_dir),
        # the plan's expectation with prompt caching beside what providers billed this run
        "predicted_vs_billed": outcome.predicted_vs_billed,
    }
    print(orjson.dumps(summary).decode(), flush=True)
    rc = 0
    for name, why in sorted(res.summary.get("disabled_teachers", {}).items()):
        print(f"teacher {name} was cut off for this run: {why}", file=sys.stderr)
        rc = 1
    s = res.summary
    # --no-wait: submitted; a later run collects
    if s.get("batch", {}).get("calls_pending"):
        print(
            f"replay: {s['batch']['calls_pending']} calls wait in provider batches; run again with the same "
            "arguments to collect them",
            file=sys.stderr,
        )
        return rc
    if s["rows"] and s["answered"] == 0:
        top = ", ".join(f"{k} ×{v}" for k, v in s["failures_by_reason"].items())
        print(f"replay: no call was answered ({top}); see the reason column of {summary['out']}", file=sys.stderr)
        rc = 1
    return rc
