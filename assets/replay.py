"""Replay stage: ``cost_plan`` (worst-case spend per state x teacher, guarded by a blocking check)
-> ``teacher_replays`` (every state sent to every teacher over OpenAI-compatible HTTP).

Calls ``composer_pipeline.replay.front.ReplayFront`` (``prepare`` → ``plan`` → ``keys`` → ``replay``),
as the CLI does; the requests ``cost_plan`` prepares reach ``teacher_replays`` of the same run as a file
(built once per run, used only when they are what the checked plan priced); the metadata numbers are
read from the run's plan and its one summary (``replay/report.py``), never recounted here.
Spend is guarded three
times: the blocking ``cost_plan_within_budget`` check runs before ``teacher_replays`` can start
(the ceiling of one run and each teacher's remaining budget in the ledger), the client reserves
budget per call (domain code), and blocking checks on the results (actual spend, per-teacher
budgets, error rate) stop everything downstream. Guards only act inside one run: materializing
``teacher_replays`` alone still goes through the client-side reservation.

Batch mode (``mode: batch``): ``teacher_replays`` submits and returns; while any call waits in a live provider
batch it writes no table (downstream steps are skipped: pairs are never built from pending rows) and records
an ``AssetObservation`` of what went out, what is held and what was already collected; ``batch_collect_sensor``
(``assets/sensors.py``) requests the run that collects the ended batches and writes the table.
"""

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from assets.ingest import render_options
from assets.layout import GROUP, stage
from assets.metadata import preview
from assets.partitions import session_check, sessions_partitions
from composer_pipeline import tables
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.replay.front import ReplayFront, load_prepared, plan_summary, prepared_path, save_prepared
from composer_pipeline.replay.plan import check_plan
from composer_pipeline.show import render_markdown, state_views
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.teachers import TeachersResource

# (one group for every asset: assets/layout.py)
STAGE = stage("replay")


@dg.asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    tags=STAGE,
    kinds={"parquet"},
    description="Worst-case cost of replaying each state to each teacher (cached calls cost nothing). "
    "Guarded by the blocking check `cost_plan_within_budget`.",
)
def cost_plan(
    context: dg.AssetExecutionContext,
    trace_states: pa.Table,
    trace_messages: pa.Table,
    teachers: TeachersResource,
    ledger: LedgerResource,
    recipes: PipelineRecipes,
) -> dg.Output:
    front = _front(teachers, ledger, recipes)
    run = front.prepare(trace_states, trace_messages, render_options(recipes))
    plan = front.plan(run)
    # the requests travel to teacher_replays of this run (built once per run; replay/front.py)
    save_prepared(run, prepared_path(teachers.prepared_dir, context.run_id, context.partition_key))
    table = tables.conform(plan.table, "cost_plan")
    s = plan_summary(plan)
    return dg.Output(
        table,
        metadata={
            "dagster/row_count": table.num_rows,
            "worst_case_usd_total": s["worst_case_usd_total"],
            "worst_case_usd_by_teacher": dg.MetadataValue.json(s["worst_case_by_teacher"]),
            "predicted_usd_by_teacher": dg.MetadataValue.json(s["predicted_usd_by_teacher"]),
            "remaining_budget_usd_by_teacher": dg.MetadataValue.json(s["remaining_budget_by_teacher"]),
            "ceiling_usd": s["ceiling_usd"],
            "cached_calls": s["cached_calls"],
            "skipped_calls_by_teacher": dg.MetadataValue.json(s["skipped_calls_by_teacher"]),
            "conditional_calls": s["conditional_calls"],
            "conditional_worst_case_usd": s["conditional_worst_case_usd"],
            "fits": s["fits"],
            "reasons": dg.MetadataValue.json(s["reasons"]),
        },
    )


def _front(teachers: TeachersResource, ledger: LedgerResource, recipes: PipelineRecipes):
    # the pairs recipe decides escalation (teachers recipe `escalation`) as it decides the pairs
    return ReplayFront(teachers.load_config(), teachers.response_cache(), ledger.open(), PairRecipe.load(recipes.pairs))


@dg.asset_check(
    asset=cost_plan,
    blocking=True,
    partitions_def=sessions_partitions,
    description="Blocks the replay when the worst case of this run exceeds the ceiling or any teacher's remaining budget.",
)
def cost_plan_within_budget(
    cost_plan: pa.Table, teachers: TeachersResource, ledger: LedgerResource
) -> dg.AssetCheckResult:
    cfg = teachers.load_config()
    # the same decision the cost_plan asset reported
    plan = check_plan(cost_plan, cfg, ledger.open())
    total, remaining = plan.total_worst_case_usd, plan.remaining_budget_by_teacher
    over = {
        t: {"worst_case_usd": plan.worst_case_by_teacher[t], "remaining_usd": float(remaining[t])}
        for t in plan.over_budget
    }
    return dg.AssetCheckResult(
        passed=plan.fits,
        metadata={
            "worst_case_usd": total,
            "ceiling_usd": float(cfg.ceiling_usd),
            "worst_case_usd_by_teacher": dg.MetadataValue.json(plan.worst_case_by_teacher),
            "predicted_usd_by_teacher": dg.MetadataValue.json(plan.predicted_by_teacher),
            "remaining_usd_by_teacher": dg.MetadataValue.json({k: float(v) for k, v in remaining.items()}),
            "teachers_over_budget": dg.MetadataValue.json(over),
        },
        # the reasons check_plan gave, not recomputed
        description=None if plan.fits else "; ".join(plan.reasons),
    )


def _example_md(replays: pa.Table, states: pa.Table, messages: pa.Table, recipes: PipelineRecipes) -> str:
    """The state view `composer-pipeline show` prints (prefix tail, action, every teacher's answer), in
    Markdown, for the first state a teacher answered."""

    answered = replays.filter(pc.equal(replays.column("status"), "answered"))
    if answered.num_rows == 0 or states.num_rows == 0:
        return "*no answered teacher calls in this partition*"
    state_id = answered.column("state_id")[0].as_py()
    (view,) = state_views(states, messages, replays, render_options(recipes), [state_id])
    return render_markdown(view, max_messages=4)


@dg.asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    tags=STAGE,
    kinds={"parquet", "openai"},
    # batch mode: a run whose calls wait in live provider batches writes no table (an observation instead)
    output_required=False,
    # politeness only (how many partitions call teachers at once); the ledger makes any number safe
    pool="teachers",
    description="Each state's prefix replayed to every teacher (OpenAI-compatible HTTP, response cache, "
    "budget ledger with per-call reservations).",
    check_specs=[
        session_check(
            "spend_within_ceiling",
            asset="teacher_replays",
            blocking=True,
            description="Actual spend of this run ≤ the ceiling of one run.",
        ),
        session_check(
            "teachers_within_budget",
            asset="teacher_replays",
            blocking=True,
            description="Each teacher's lifetime spend in the ledger ≤ its budget.",
        ),
        session_check(
            "error_rate", asset="teacher_replays", blocking=True, description="Failed calls / all calls ≤ threshold."
        ),
    ],
)
def teacher_replays(
    context: dg.AssetExecutionContext,
    trace_states: pa.Table,
    trace_messages: pa.Table,
    cost_plan: pa.Table,
    teachers: TeachersResource,
    ledger: LedgerResource,
    recipes: PipelineRecipes,
):
    front = _front(teachers, ledger, recipes)
    cfg, led = front.config, front.ledger
    # the plan the blocking check passed (the same decision)
    plan = check_plan(cost_plan, cfg, led)
    # missing key variable / unknown host: fail before any call
    keys = front.keys(plan, teachers.api_key_values())
    teachers.ensure_local_servers(log=context.log, only=plan.teachers_to_call)  # all cached: no server needed
    step = {"last": -1}

    def progress(done: int, total: int) -> None:  # log every ~10%
        tenth = (10 * done) // max(total, 1)
        if tenth != step["last"]:
            step["last"] = tenth
            context.log.info(f"teacher calls: {done}/{total}")

    # the requests cost_plan built in this run, when they are the ones its checked table priced; else built here
    run = load_prepared(prepared_path(teachers.prepared_dir, context.run_id, context.partition_key), cfg, cost_plan)
    if run is None:
        run = front.prepare(trace_states, trace_messages, render_options(recipes))
    # batch mode submits and returns (no 24-hour step); batch_collect_sensor requests the run that collects
    outcome = front.replay(run, plan, keys, context.run_id, progress, wait=cfg.mode != "batch")
    res = outcome.result
    table = tables.conform(res.table, "teacher_replays")
    # run_report.replay_summary: the dict `composer-pipeline replay` prints
    summary = res.summary
    total = float(summary["spend_usd"])  # this run's spend
    batch = summary.get("batch") or {}
    # batches still live: no table (nothing downstream runs), an observation
    if batch.get("calls_pending"):
        context.log_event(_submitted(context.partition_key, summary, batch))
        yield from _checks(summary, cfg, led, recipes, pending=int(batch["calls_pending"]))
        return

    yield dg.Output(
        table,
        metadata={
            "dagster/row_count": table.num_rows,
            "spend_usd": total,
            "spend_usd_by_teacher": dg.MetadataValue.json(summary["spend_usd_by_teacher"]),
            # the cost plan's prediction beside what providers billed this run (cache reads/writes at their
            # prices, and the same tokens at full price): the shape `composer-pipeline replay` prints
            "predicted_vs_billed": dg.MetadataValue.json(outcome.predicted_vs_billed),
            # numbers plotted over runs, each the summary's, under the summary's name (replay/report.py)
            "fitted_answers": summary["fitted_answers"],
            "cached_prompt_tokens": int(sum(summary["cached_prompt_tokens_by_teacher"].values())),
            "http_requests": summary["http_requests"],
            "from_cache": summary["from_cache"],
            "failures_by_reason": dg.MetadataValue.json(summary["failures_by_reason"]),
            "summary": dg.MetadataValue.json(summary),
            "preview": preview(
                table,
                [
                    "teacher",
                    "state_id",
                    "status",
                    "cache_hit",
                    "action",
                    "cost_usd",
                    "paid_usd",
                    "cached_tokens",
                    "elided_messages",
                    "latency_s",
                ],
            ),
            "example": dg.MetadataValue.md(_example_md(table, trace_states, trace_messages, recipes)),
        },
    )
    yield from _checks(summary, cfg, led, recipes)


def _submitted(partition: str, summary: dict, batch: dict) -> dg.AssetObservation:
    """What a batch-mode run that left calls in live batches did: no ``teacher_replays`` table (its pending rows
    are no answers, and nothing downstream may pair them); this observation says what went out, what is held
    and what was already collected. ``batch_collect_sensor`` requests the run that writes the table."""
    return dg.AssetObservation(
        asset_key="teacher_replays",
        partition=partition,
        description=f"{batch['calls_pending']} calls wait in live provider batches; batch_collect_sensor "
        "collects them once their batches end",
        metadata={
            "batch_pending_calls": int(batch["calls_pending"]),
            "batch_held_usd": float(batch["held_usd"]),
            "live_batch_ids": dg.MetadataValue.json(batch["live_batch_ids"]),
            "batches_submitted": int(batch["batches_submitted"]),
            "batches_collected": int(batch["batches_collected"]),
            "calls_resubmitted": int(batch["calls_resubmitted"]),
            "answered_so_far": int(summary["answered"]),
            "spend_usd": float(summary["spend_usd"]),
            "summary": dg.MetadataValue.json(summary),
        },
    )


def _checks(summary: dict, cfg, led, recipes: PipelineRecipes, pending: int = 0):
    """The three blocking checks of ``teacher_replays``; ``pending`` calls still in live batches are neither
    answers nor failures (they count in no rate; their held money counts against the ceiling)."""
    total = float(summary["spend_usd"])
    held = float((summary.get("batch") or {}).get("held_usd") or 0.0) if pending else 0.0
    yield dg.AssetCheckResult(
        check_name="spend_within_ceiling",
        passed=total + held <= cfg.ceiling_usd + 1e-12,
        metadata={"spend_usd": total, "batch_held_usd": held, "ceiling_usd": float(cfg.ceiling_usd)},
    )
    lifetime = {t.name: float(led.spent(t.name)) for t in cfg.teachers}
    over = {t.name: lifetime[t.name] for t in cfg.teachers if lifetime[t.name] > t.budget_usd + 1e-12}
    yield dg.AssetCheckResult(
        check_name="teachers_within_budget",
        passed=not over,
        metadata={
            "lifetime_spend_usd": dg.MetadataValue.json(lifetime),
            "budget_usd": dg.MetadataValue.json({t.name: t.budget_usd for t in cfg.teachers}),
            "over_budget": dg.MetadataValue.json(over),
        },
    )
    # rows that got no answer (failed or budget_exhausted); waiting for money held by other runs' calls
    # in flight is not an error and makes no row (it shows as reservation_waits)
    unanswered = summary["failed"] - pending + summary["budget_exhausted"]
    rows = summary["rows"] - pending
    rate = unanswered / rows if rows else 0.0
    yield dg.AssetCheckResult(
        check_name="error_rate",
        passed=rate <= recipes.max_replay_error_rate,
        metadata={
            "error_rate": rate,
            "unanswered": unanswered,
            "rows": rows,
            "batch_pending": pending,
            "threshold": recipes.max_replay_error_rate,
            "failed": summary["failed"] - pending,
            "budget_exhausted": summary["budget_exhausted"],
            "reservation_waits": summary["reservation_waits"],
            "disabled_teachers": dg.MetadataValue.json(summary["disabled_teachers"]),
        },
    )
