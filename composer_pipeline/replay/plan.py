"""The cost plan: worst case per call at full price, what the response cache already holds, the
prediction with cached prefixes, and ``check_plan``: the one decision whether the run fits the
teachers' budgets and the run ceiling (the blocking ``cost_plan`` check reads it).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.ledger import Ledger
from composer_pipeline.ledger.batches import batch_holds
from composer_pipeline.replay.requests import ReplayRequest, _extends, _legacy_id
from composer_pipeline.teachers.anthropic import min_cached_tokens
from composer_pipeline.teachers.cache import (
    ResponseCache,
)
from composer_pipeline.teachers.config import TeachersConfig


@dataclass
class CostPlan:
    table: pa.Table  # schema cost_plan
    # USD still to be risked (cache hits excluded)
    worst_case_by_teacher: dict[str, float]
    remaining_budget_by_teacher: dict[str, float]
    fits: bool
    reasons: list[str]
    ceiling_usd: float = 0.0
    total_worst_case_usd: float = 0.0
    # teachers whose worst case exceeds what remains
    over_budget: list[str] = field(default_factory=list)
    predicted_by_teacher: dict[str, float] = field(default_factory=dict)  # expected USD with prompt caching
    # calls never sent (skip_reason), per teacher
    skipped_by_teacher: dict[str, int] = field(default_factory=dict)
    # escalation: calls of tiers after the first, sent only if the state's earlier answers can still make a pair
    # (their worst case is in the totals above all the same: what might be called is reserved)
    conditional_calls: int = 0
    conditional_worst_case_usd: float = 0.0

    @property
    def teachers_to_call(self) -> set[str]:
        """Teachers with at least one call the cache and the ledger cannot answer (the ones that need a key)."""
        return {
            t
            for t, c, skip in zip(
                self.table.column("teacher").to_pylist(),
                self.table.column("cached").to_pylist(),
                self.table.column("skip_reason").to_pylist(),
            )
            if not c and skip is None
        }


# ---------------------------------------------------------------------------------------------
def plan_requests(
    requests: list[ReplayRequest], config: TeachersConfig, cache: ResponseCache, ledger: Ledger
) -> CostPlan:
    rows: dict[str, list[Any]] = {name: [] for name in tables.COST_PLAN.names}
    # a name reused for another endpoint: refused first
    ledger.check_identities(config.identities(), register=False)
    in_cache = {
        r.call_id
        for r in requests
        if _cache_get(cache, r.call_id) is not None or _cache_get(cache, _legacy_id(r)) is not None
    }
    in_ledger = ledger.answered_ids(sorted({r.call_id for r in requests} - in_cache))  # paid answers the cache lost
    legacy = ledger.answered_ids(sorted({_legacy_id(r) for r in requests if r.call_id not in in_cache | in_ledger}))
    in_ledger |= {r.call_id for r in requests if _legacy_id(r) in legacy}
    for r in requests:
        rows["state_id"].append(r.state_id)
        rows["teacher"].append(r.teacher.name)
        rows["call_id"].append(r.call_id)
        rows["cached"].append(r.call_id in in_cache or r.call_id in in_ledger)
        rows["est_prompt_tokens"].append(r.est_prompt_tokens)
        rows["worst_case_usd"].append(r.worst_case_usd)
        rows["skip_reason"].append(r.skip_reason)
    rows["predicted_usd"] = predict_cached(requests)
    return check_plan(pa.table(rows, schema=tables.COST_PLAN), config, ledger)


# typical bytes per token of English, code and JSON (the worst case assumes 1)
PREDICT_BYTES_PER_TOKEN = 4.0


# platform.openai.com/docs/guides/prompt-caching
OPENAI_MIN_CACHED, OPENAI_CACHE_STEP = 1024, 128


def predict_cached(requests: list[ReplayRequest]) -> list[float]:
    """Expected USD per request with prompt caching, for the cost plan beside the full-price worst case.

    Per teacher and stream, in stream order (what session-affine scheduling sends): a request whose
    messages extend the previous request's reads that previous prefix from the cache (OpenAI-style: in
    128-token steps from 1024 tokens; Anthropic: reads it and writes the rest) at the teacher's cached
    price; the first request of a stream, or one whose prefix changed (fitting moved its elision point),
    pays in full (Anthropic: at the write price; nothing is cached below the model family's minimum,
    anthropic.min_cached_tokens). Tokens at a typical 4 bytes each, the answer at
    ``max_tokens``. An estimate to compare with what gets billed, never a reservation (those stay at the
    full-price worst case)."""
    out = [0.0] * len(requests)
    groups: dict[tuple[str, str | None], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        groups[(r.teacher.name, r.stream_id)].append(i)
    for idx in groups.values():
        idx.sort(key=lambda i: (requests[i].order, i))
        prev_msgs: list[dict] | None = None
        prev_tokens = 0
        for n, i in enumerate(idx):
            r = requests[i]
            t = r.teacher
            msgs = r.body.get("messages") or []
            # never sent: costs nothing, and the next one cannot read it
            if r.skip_reason is not None:
                prev_msgs, prev_tokens = None, 0
                continue
            n_bytes = r.prompt_bytes or len(orjson.dumps(msgs)) + len(orjson.dumps(r.body.get("tools") or []))
            tokens = int(n_bytes / PREDICT_BYTES_PER_TOKEN)
            extends = _extends(msgs, prev_msgs)
            reads = writes = 0
            if t.api == "anthropic":
                floor = min_cached_tokens(t.model)  # per model family
                if extends and prev_tokens >= floor:
                    reads = prev_tokens
                writes = tokens - reads if tokens >= floor and n < len(idx) - 1 else 0  # the last one writes nothing
            elif extends and prev_tokens >= OPENAI_MIN_CACHED:
                reads = (min(prev_tokens, tokens) // OPENAI_CACHE_STEP) * OPENAI_CACHE_STEP
            uncached = max(0, tokens - reads - writes)
            out[i] = (
                uncached * t.input_usd_per_mtok
                + reads * t.cached_price
                + writes * t.write_price
                + t.max_tokens * t.output_usd_per_mtok
            ) / 1e6
            prev_msgs, prev_tokens = msgs, tokens
    return out


def check_plan(plan: pa.Table, config: TeachersConfig, ledger: Ledger) -> CostPlan:
    """Whether a ``cost_plan`` table fits: the worst case of its uncached calls against the run's
    ceiling and each teacher's remaining budget in the ledger. THE fit decision: the CLI, the
    ``cost_plan`` asset and its blocking check all read this one result."""
    worst_by = {t.name: 0.0 for t in config.teachers}
    predicted_by = {t.name: 0.0 for t in config.teachers}
    predicted = (
        plan.column("predicted_usd").to_pylist() if "predicted_usd" in plan.column_names else [None] * plan.num_rows
    )
    # money live provider batches hold stays held up to 24 h: it is not room; their calls need no new money
    pending, held = batch_holds(ledger, config.names, plan.column("call_id").to_pylist())
    for teacher, cached, usd, pred, cid in zip(
        plan.column("teacher").to_pylist(),
        plan.column("cached").to_pylist(),
        plan.column("worst_case_usd").to_pylist(),
        predicted,
        plan.column("call_id").to_pylist(),
    ):
        if not cached and cid not in pending:
            worst_by[teacher] = worst_by.get(teacher, 0.0) + float(usd or 0.0)
            predicted_by[teacher] = predicted_by.get(teacher, 0.0) + float(usd if pred is None else pred)
    skipped_by = {t.name: 0 for t in config.teachers}
    skips = plan.column("skip_reason").to_pylist() if "skip_reason" in plan.column_names else [None] * plan.num_rows
    for teacher, skip in zip(plan.column("teacher").to_pylist(), skips):
        if skip is not None:
            skipped_by[teacher] = skipped_by.get(teacher, 0) + 1
    conditional, conditional_usd = _conditional(plan, skips, config)
    # money in flight may come back; money held by live batches not soon
    remaining = {t.name: max(0.0, ledger.room(t.name, t.budget_usd) - held.get(t.name, 0.0)) for t in config.teachers}
    reasons, over = [], []
    for t in config.teachers:
        if worst_by[t.name] > remaining[t.name]:
            over.append(t.name)
            reasons.append(
                f"teacher {t.name}: worst case ${worst_by[t.name]:.4f} exceeds remaining budget ${remaining[t.name]:.4f} "
                f"(of ${t.budget_usd:g}; expected with prompt caching ${predicted_by[t.name]:.4f}); "
                "calls past it will be recorded budget_exhausted"
            )
    total = sum(worst_by.values())
    if total > config.ceiling_usd:
        reasons.append(
            f"run worst case ${total:.4f} exceeds ceiling_usd ${config.ceiling_usd:g}; calls past it will be recorded budget_exhausted"
        )
    for column, kind in (("predicted_usd", pa.float64()), ("skip_reason", pa.string())):
        # a plan written before this column existed
        if column not in plan.column_names:
            plan = plan.append_column(column, pa.array([None] * plan.num_rows, kind))
    table = tables.conform(plan, "cost_plan")
    return CostPlan(
        table,
        worst_by,
        remaining,
        not reasons,
        reasons,
        config.ceiling_usd,
        total,
        over,
        predicted_by,
        skipped_by,
        conditional,
        conditional_usd,
    )


def _conditional(plan: pa.Table, skips: list[str | None], config: TeachersConfig) -> tuple[int, float]:
    """Calls (and their worst case) of escalation tiers after the first that the cache cannot answer."""
    n, usd = 0, 0.0
    for teacher, cached, worst, skip in zip(
        plan.column("teacher").to_pylist(),
        plan.column("cached").to_pylist(),
        plan.column("worst_case_usd").to_pylist(),
        skips,
    ):
        if config.tier_of(teacher) > 0 and not cached and skip is None:
            n, usd = n + 1, usd + float(worst or 0.0)
    return n, usd


def _cache_get(cache: ResponseCache, cid: str) -> dict[str, Any] | None:
    try:
        return cache.get(cid)
    # an unreadable cache is a miss; the ledger still has every paid answer
    except OSError:
        return None
