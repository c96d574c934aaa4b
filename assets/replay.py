"""Replay stage: ``cost_plan`` (worst-case spend per state x teacher, guarded by a blocking check)
-> ``teacher_replays`` (every state sent to every teacher over OpenAI-compatible HTTP).

Calls ``composer_pipeline.teachers.replay.plan_costs`` / ``replay_states``. Spend is guarded three
times: the blocking ``cost_plan_within_budget`` check runs before ``teacher_replays`` can start
(the ceiling of one run and each teacher's remaining budget in the ledger), the client reserves
budget per call (domain code), and blocking checks on the results (actual spend, per-teacher
budgets, error rate) stop everything downstream. Guards only act inside one run: materializing
``teacher_replays`` alone still goes through the client-side reservation.
"""

import json

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from assets.ingest import render_options
from assets.metadata import chat_markdown, counts, preview
from assets.partitions import sessions_partitions
from composer_pipeline import tables
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.teachers import TeachersResource

GROUP = "replay"


@dg.asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
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
    from composer_pipeline.teachers.replay import plan_costs

    cfg = teachers.load_config()
    plan = plan_costs(trace_states, trace_messages, cfg, render_options(recipes), teachers.response_cache(), ledger.open())
    table = tables.conform(plan.table, "cost_plan")
    return dg.Output(
        table,
        metadata={
            "dagster/row_count": table.num_rows,
            "worst_case_usd_total": float(sum(plan.worst_case_by_teacher.values())),
            "worst_case_usd_by_teacher": dg.MetadataValue.json({k: float(v) for k, v in plan.worst_case_by_teacher.items()}),
            "remaining_budget_usd_by_teacher": dg.MetadataValue.json(
                {k: float(v) for k, v in plan.remaining_budget_by_teacher.items()}
            ),
            "ceiling_usd": float(cfg.ceiling_usd),
            "cached_calls": int(pc.sum(table.column("cached")).as_py() or 0),
            "fits": bool(plan.fits),
            "reasons": dg.MetadataValue.json(list(plan.reasons)),
        },
    )


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
    led = ledger.open()
    uncached = cost_plan.filter(pc.invert(cost_plan.column("cached")))
    by_teacher: dict[str, float] = {}
    for t, usd in zip(uncached.column("teacher").to_pylist(), uncached.column("worst_case_usd").to_pylist()):
        by_teacher[t] = by_teacher.get(t, 0.0) + float(usd or 0.0)
    total = sum(by_teacher.values())
    remaining = {t.name: float(led.room(t.name, t.budget_usd)) for t in cfg.teachers}  # calls in flight elsewhere settle first
    over = {t: {"worst_case_usd": v, "remaining_usd": remaining.get(t, 0.0)} for t, v in by_teacher.items() if v > remaining.get(t, 0.0)}
    passed = total <= cfg.ceiling_usd and not over
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "worst_case_usd": total,
            "ceiling_usd": float(cfg.ceiling_usd),
            "worst_case_usd_by_teacher": dg.MetadataValue.json(by_teacher),
            "remaining_usd_by_teacher": dg.MetadataValue.json(remaining),
            "teachers_over_budget": dg.MetadataValue.json(over),
        },
        description=None if passed else (
            f"worst case ${total:.4f} > ceiling ${cfg.ceiling_usd:.4f}" if total > cfg.ceiling_usd
            else f"over remaining budget: {sorted(over)}"
        ),
    )


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda q: float(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))])  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": float(v[-1])}


def _example_md(replays: pa.Table, states: pa.Table, messages: pa.Table, recipes: PipelineRecipes) -> str:
    from composer_pipeline.render import Conversation, render_state

    answered = replays.filter(pc.equal(replays.column("status"), "answered"))
    if answered.num_rows == 0 or states.num_rows == 0:
        return "*no answered teacher calls in this partition*"
    state_id = answered.column("state_id")[0].as_py()
    row = states.filter(pc.equal(states.column("state_id"), state_id)).to_pylist()[0]
    rendered = render_state(Conversation.from_table(messages), row, render_options(recipes))
    out = [f"### State `{state_id}`: prompt (tail)\n", chat_markdown(rendered.messages, tail=4),
           "**agent's action**", "```json", json.dumps(json.loads(row["action"]), indent=1)[:1200], "```"]
    for r in replays.filter(pc.equal(replays.column("state_id"), state_id)).to_pylist():
        out += [f"**{r['teacher']}** ({r['model']}, {r['status']}, ${r['cost_usd'] or 0:.5f}"
                + (", cache hit: paid $0 now" if r["cache_hit"] else "") + ")",
                "```text", (r["raw_answer"] or r["reason"] or "")[:1200].replace("```", "ʼʼʼ"), "```"]
    return "\n".join(out)


@dg.asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    kinds={"parquet", "openai"},
    pool="teachers",  # politeness only (how many partitions call teachers at once); the ledger makes any number safe
    description="Each state's prefix replayed to every teacher (OpenAI-compatible HTTP, response cache, "
    "budget ledger with per-call reservations).",
    check_specs=[
        dg.AssetCheckSpec("spend_within_ceiling", asset="teacher_replays", blocking=True,
                          description="Actual spend of this run ≤ the ceiling of one run."),
        dg.AssetCheckSpec("teachers_within_budget", asset="teacher_replays", blocking=True,
                          description="Each teacher's lifetime spend in the ledger ≤ its budget."),
        dg.AssetCheckSpec("error_rate", asset="teacher_replays", blocking=True,
                          description="Failed calls / all calls ≤ threshold."),
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
    from composer_pipeline.teachers.replay import replay_states

    from composer_pipeline.teachers.preflight import preflight

    uncached = set(cost_plan.filter(pc.invert(cost_plan.column("cached"))).column("teacher").to_pylist())
    cfg = teachers.load_config()
    keys = teachers.api_key_values()
    preflight(cfg, keys, teachers=uncached)  # missing key variable / unknown host: fail before any call
    teachers.ensure_local_servers(log=context.log, only=uncached)  # all cached: no server needed
    led = ledger.open()
    step = {"last": -1}

    def progress(done: int, total: int) -> None:  # log every ~10%
        tenth = (10 * done) // max(total, 1)
        if tenth != step["last"]:
            step["last"] = tenth
            context.log.info(f"teacher calls: {done}/{total}")

    res = replay_states(
        trace_states, trace_messages, cfg, keys,
        render_opts=render_options(recipes), cache=teachers.response_cache(), ledger=led,
        run_id=context.run_id, progress=progress,
    )
    table = tables.conform(res.table, "teacher_replays")
    rows = table.to_pylist()
    spend: dict[str, float] = {}
    for r in rows:
        spend[r["teacher"]] = spend.get(r["teacher"], 0.0) + float(r["paid_usd"] or 0.0)  # this run's spend
    failed = [r for r in rows if r["status"] != "answered"]
    cache_hits = sum(1 for r in rows if r["cache_hit"])
    latencies = [float(r["latency_s"]) for r in rows if r["latency_s"] is not None and not r["cache_hit"]]
    total = sum(spend.values())

    yield dg.Output(
        table,
        metadata={
            "dagster/row_count": table.num_rows,
            "spend_usd": total,
            "spend_usd_by_teacher": dg.MetadataValue.json(spend),
            "calls_by_teacher": dg.MetadataValue.json(counts(r["teacher"] for r in rows)),
            "cache_hits": cache_hits,
            "failures_by_reason": dg.MetadataValue.json(counts(f"{r['status']}: {(r['reason'] or '')[:80]}" for r in failed)),
            "latency_s": dg.MetadataValue.json(_percentiles(latencies)),
            "summary": dg.MetadataValue.json(res.summary),
            "preview": preview(table, ["teacher", "state_id", "status", "action", "cost_usd", "paid_usd", "latency_s"]),
            "example": dg.MetadataValue.md(_example_md(table, trace_states, trace_messages, recipes)),
        },
    )
    yield dg.AssetCheckResult(
        check_name="spend_within_ceiling",
        passed=total <= cfg.ceiling_usd + 1e-12,
        metadata={"spend_usd": total, "ceiling_usd": float(cfg.ceiling_usd)},
    )
    lifetime = {t.name: float(led.spent(t.name)) for t in cfg.teachers}
    over = {t.name: lifetime[t.name] for t in cfg.teachers if lifetime[t.name] > t.budget_usd + 1e-12}
    yield dg.AssetCheckResult(
        check_name="teachers_within_budget",
        passed=not over,
        metadata={"lifetime_spend_usd": dg.MetadataValue.json(lifetime),
                  "budget_usd": dg.MetadataValue.json({t.name: t.budget_usd for t in cfg.teachers}),
                  "over_budget": dg.MetadataValue.json(over)},
    )
    # rows that got no answer (failed or budget_exhausted); waiting for money held by other runs' calls
    # in flight is not an error and makes no row (it shows as reservation_waits)
    errors = failed
    rate = len(errors) / len(rows) if rows else 0.0
    yield dg.AssetCheckResult(
        check_name="error_rate",
        passed=rate <= recipes.max_replay_error_rate,
        metadata={"error_rate": rate, "failed": len(errors), "calls": len(rows), "threshold": recipes.max_replay_error_rate,
                  "budget_exhausted": sum(1 for r in rows if r["status"] == "budget_exhausted"),
                  "reservation_waits": int(res.summary.get("reservation_waits", 0)),
                  "disabled_teachers": dg.MetadataValue.json(res.summary.get("disabled_teachers", {}))},
    )
