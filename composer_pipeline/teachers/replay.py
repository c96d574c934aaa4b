"""Multi-teacher replay: every trace state × every teacher → one ``teacher_replays`` row.

In:  ``trace_states`` + ``trace_messages`` tables, a :class:`TeachersConfig`, API keys as values,
     render options, a :class:`ResponseCache` and a :class:`Ledger`.
Out: :class:`ReplayRun` (what the CLI and the assets run, through ``teachers/front.py``): ``prepare`` renders the requests,
     ``.plan`` → :class:`CostPlan` (schema ``cost_plan``: worst case per call, what the cache already
     holds, whether it fits the budgets and the run ceiling), ``.replay`` → :class:`ReplayResult` (schema
     ``teacher_replays`` + :func:`run_report.replay_summary`). ``make_request`` / ``plan_requests`` /
     ``replay_requests`` are its steps, for callers that build requests by hand (tests, benchmarks).

Each teacher sees exactly what the agent saw: ``render.render_states`` gives the prefix as OpenAI
chat messages and the tools the stream shows the agent using; the request body is
``{model, messages, tools, <teacher request params>}`` and nothing else (no key, no ids), so
``call_id = sha256(teacher|model|base_url|canonical body)`` is a pure content address of one request to
one endpoint. Answers bought under the id of earlier versions (no ``base_url``) are still served.

Nothing is dropped: a state the renderer does not yield, a teacher whose key is missing, a refused
reservation and every transport failure each become a row with its status and reason.
Deliberately simplified: all state × teacher calls of a run are scheduled at once and gated by each
teacher's semaphore (fine for partitions of thousands of states; not a streaming scheduler).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import httpx
import orjson
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.pairs.build import PairRecipe
from composer_pipeline.render import (
    FIT_BYTES_PER_TOKEN,
    Conversation,
    JsonSizes,
    RenderOptions,
    StreamRenderer,
    fit_messages,
    min_window,
    render_state,
)
from composer_pipeline.teachers.cache import (
    ResponseCache,
    StreamCallIds,
    call_id,
    canonical_json,
    legacy_call_id,
)
from composer_pipeline.teachers.client import (
    CallResult,
    TeacherGuard,
    answer_from_response,
    call_teacher,
    make_http_client,
    stream_cache_key,
)
from composer_pipeline.teachers.anthropic import CacheHint, min_cached_tokens
from composer_pipeline.teachers.config import TeacherConfig, TeachersConfig, clean_api_keys
from composer_pipeline.teachers.escalation import Escalation, waves
from composer_pipeline.teachers.ledger import AsyncLedger, ClaimLost, Ledger, ReplayInterrupted
from composer_pipeline.teachers.ledger.batches import batch_holds
from composer_pipeline.teachers.pricing import worst_case_usd
from composer_pipeline.teachers.run_report import RunInfo, replay_summary
from composer_pipeline.teachers.token_count import counter_for


@dataclass(frozen=True)
class ReplayRequest:
    state_id: str
    session_key: str | None
    teacher: TeacherConfig
    body: dict[str, Any]
    call_id: str
    est_prompt_tokens: int
    worst_case_usd: float
    stream_id: str | None = None  # session-affine scheduling and the prompt_cache_key
    order: int = 0  # position in its stream (prefix length): a stream's requests go in this order
    elided_messages: int = 0  # what fitting the teacher's window did (render.fit_messages)
    cut_messages: int = 0
    source: tuple[list[dict], list[dict] | None] | None = None  # the unfitted prefix, for a tighter refit
    counter: Callable[[Any], int] | None = None  # the teacher's tokenizer count (local models), else the bytes ratio
    cache_hint: CacheHint | None = None  # its place in its stream (with_cache_hints): where to read, whether to write
    skip_reason: str | None = None  # never sent, and why (over_context_window: even fitted it is too long)
    legacy_id: str = ""  # legacy_call_id of the body (computed with call_id; "" = compute when asked)
    prompt_bytes: int = 0  # JSON bytes of its messages and tools (0 = not measured)


@dataclass
class CostPlan:
    table: pa.Table  # schema cost_plan
    worst_case_by_teacher: dict[str, float]  # USD still to be risked (cache hits excluded)
    remaining_budget_by_teacher: dict[str, float]
    fits: bool
    reasons: list[str]
    ceiling_usd: float = 0.0
    total_worst_case_usd: float = 0.0
    over_budget: list[str] = field(default_factory=list)  # teachers whose worst case exceeds what remains
    predicted_by_teacher: dict[str, float] = field(default_factory=dict)  # expected USD with prompt caching
    skipped_by_teacher: dict[str, int] = field(default_factory=dict)  # calls never sent (skip_reason), per teacher
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


@dataclass
class ReplayResult:
    table: pa.Table  # schema teacher_replays
    summary: dict[str, Any] = field(default_factory=dict)  # run_report.replay_summary


def request_body(teacher: TeacherConfig, messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
    """What is sent (and hashed): the model, the rendered prefix, the tools, the sampling params."""
    body: dict[str, Any] = {"model": teacher.model, "messages": messages, **teacher.request_params()}
    if tools:
        body["tools"] = tools
    return body


def make_request(
    state_id: str,
    session_key: str | None,
    teacher: TeacherConfig,
    messages: list[dict],
    tools: list[dict] | None,
    *,
    stream_id: str | None = None,
    order: int = 0,
    bytes_per_token: float | None = None,
    counter: Callable[[Any], int] | None = None,
    scale: float = 1.0,
    sizes: JsonSizes | None = None,
    ids: StreamCallIds | None = None,
) -> ReplayRequest:
    """One state × teacher request; fitted into the teacher's ``context_window`` when it has one (counted
    with ``counter``, the teacher's tokenizer, when given, else at ``bytes_per_token``). A request that does
    not fit even fitted carries its ``skip_reason`` and is never sent. ``sizes`` and ``ids`` measure and hash
    the messages a stream's requests share once (:func:`build_requests`)."""
    sizes = sizes if sizes is not None else JsonSizes()
    elided = cut = 0
    source = None
    skip = None
    if teacher.context_window is not None:
        budget = teacher.context_window - teacher.max_tokens
        fitted = fit_messages(
            messages,
            tools,
            budget,
            bytes_per_token=bytes_per_token or FIT_BYTES_PER_TOKEN,
            step=teacher.fit_elide_step,
            count=counter,
            scale=scale,
            sizes=sizes,
            key=(teacher.name, stream_id),
        )
        source = (messages, tools)
        messages, tools, elided, cut = fitted.messages, fitted.tools, fitted.elided, fitted.cut
        if not fitted.fits:
            skip = (
                f"over_context_window: not sent: about {fitted.tokens} prompt tokens after fitting ({elided} messages "
                f"elided, {cut} cut) exceed {teacher.name}'s context_window {teacher.context_window} less "
                f"max_tokens {teacher.max_tokens} ({budget} tokens)"
            )
    body = request_body(teacher, messages, tools)
    n_bytes = sizes.of_list(messages, (teacher.name, stream_id)) + (sizes.of_list(tools) if tools else 0)
    est, worst = worst_case_usd(body, teacher, n_bytes)
    if ids is None:
        cid, legacy = call_id(teacher.name, teacher.model, body, teacher.base_url), ""
    else:
        cid, legacy = ids.ids(body)
    return ReplayRequest(
        state_id,
        session_key,
        teacher,
        body,
        cid,
        est,
        0.0 if skip else worst,
        stream_id,
        order,
        elided,
        cut,
        source,
        counter,
        skip_reason=skip,
        legacy_id=legacy,
        prompt_bytes=n_bytes,
    )


def _legacy_id(r: ReplayRequest) -> str:
    return r.legacy_id or legacy_call_id(r.teacher.name, r.teacher.model, r.body)


REFIT_FACTOR = 0.7  # a provider said "too long": count 1/0.7 more tokens per byte and fit again, once


def refit(r: ReplayRequest) -> ReplayRequest | None:
    """The request fitted tighter after a provider's context-length answer (None: nothing to refit, or the
    tighter fit is still over the window: never sent again). Keeps the original ``call_id``: the answer is
    the answer to this state for this teacher."""
    if r.source is None:
        return None
    tighter = make_request(
        r.state_id,
        r.session_key,
        r.teacher,
        r.source[0],
        r.source[1],
        stream_id=r.stream_id,
        order=r.order,
        bytes_per_token=FIT_BYTES_PER_TOKEN * REFIT_FACTOR,
        counter=r.counter,
        scale=1 / REFIT_FACTOR,
    )
    if tighter.skip_reason is not None:
        return None
    return dataclasses.replace(tighter, call_id=r.call_id, legacy_id=_legacy_id(r))


def render_prompt(conv, state_row: dict, render_opts):
    """The rendered prefix (messages + tools) every teacher is sent for one state.

    The single rendering path of replay; ``composer-pipeline show`` prints this same function's output.
    """
    return render_state(conv, state_row, render_opts)


def check_windows(config: TeachersConfig, render_opts) -> None:
    """Every ``context_window`` holds the system prompt actually rendered (the ingest recipe's, which the
    teachers recipe cannot see at load), one turn and ``max_tokens``; else a ValueError naming the teacher."""
    system_prompt = (render_opts or RenderOptions()).system_prompt
    for t in config.teachers:
        if t.context_window is not None and t.context_window < min_window(t.max_tokens, system_prompt):
            raise ValueError(
                f"{config.source or 'teachers'}: teachers ({t.name}): context_window {t.context_window} is too small "
                f"for the system prompt ({len(system_prompt)} characters) plus one turn and max_tokens {t.max_tokens} "
                f"(needs at least {min_window(t.max_tokens, system_prompt)} tokens)"
            )


# a state whose rendered prefix holds no user message: its parent links are null, missing or dangling, so the
# teacher would see the system prompt alone; never sent (issue 34 §2), one row per teacher says so
NO_USER_TURN = (
    "no_user_turn: not sent: the rendered prefix holds no user message, only the system prompt "
    "(the state's parent links are null, missing or dangling)"
)


def build_requests(
    states: pa.Table, messages: pa.Table, config: TeachersConfig, render_opts
) -> tuple[list[ReplayRequest], list[tuple[str, str | None, str]]]:
    """All state × teacher requests (in state order, then teacher order), and (state_id, session_key,
    reason) for states that failed to render.

    Near-linear in a session's length: the states of a stream are prepared in stream order, their rendered
    messages are shared objects (``render.Conversation``), each measured (:class:`~render.JsonSizes`),
    counted by a local tokenizer and hashed (:class:`StreamCallIds`) once, so a state costs what its new
    messages cost rather than its whole prefix again."""
    check_windows(config, render_opts)
    conv = Conversation.from_table(messages)
    sizes = JsonSizes()
    canonical = _CanonicalJson()
    counters = {t.name: _memoized(counter_for(config, t)) for t in config.teachers}
    rows = states.to_pylist()
    by_state: list[list[ReplayRequest]] = [[] for _ in rows]
    failed_at: dict[int, tuple[str, str | None, str]] = {}
    ids: dict[tuple[str, str], StreamCallIds] = {}
    order = sorted(range(len(rows)), key=lambda i: (str(rows[i].get("stream_id")), _prefix_len(rows[i]), i))
    renderer = StreamRenderer(conv, render_opts)  # render_prompt's output, extending each stream's previous state
    for i in order:
        row = rows[i]
        try:
            rs = renderer.render(row)
        except Exception as e:  # one bad state must not sink the partition: recorded per teacher
            failed_at[i] = (
                row["state_id"],
                row.get("session_key"),
                f"render_error: {type(e).__name__}: {str(e)[:200]}",
            )
            continue
        if not rs.messages:
            failed_at[i] = (row["state_id"], row.get("session_key"), "render_error: empty prompt")
            continue
        skip = None if any(m.get("role") == "user" for m in rs.messages) else NO_USER_TURN
        for t in config.teachers:
            key = (t.name, str(row.get("stream_id")))
            if key not in ids:
                ids[key] = StreamCallIds(t.name, t.model, t.base_url, canonical)
            req = make_request(
                row["state_id"],
                row.get("session_key"),
                t,
                rs.messages,
                rs.tools,
                stream_id=row.get("stream_id"),
                order=_prefix_len(row),
                counter=counters[t.name],
                sizes=sizes,
                ids=ids[key],
            )
            by_state[i].append(req if skip is None else dataclasses.replace(req, skip_reason=skip, worst_case_usd=0.0))
    reqs = [r for per_state in by_state for r in per_state]
    return reqs, [failed_at[i] for i in sorted(failed_at)]


def _prefix_len(row: dict) -> int:
    return int(row.get("n_prefix_messages") or 0)


class _CanonicalJson:
    """Canonical JSON of each message object, made once (messages are shared by a stream's states)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, bytes]] = {}

    def __call__(self, obj: Any) -> bytes:
        hit = self._by_id.get(id(obj))
        if hit is None:
            hit = self._by_id[id(obj)] = (obj, canonical_json(obj))
        return hit[1]


def _memoized(count: Callable[[Any], int] | None) -> Callable[[Any], int] | None:
    """A tokenizer's count per message object, counted once (the objects are kept: an id is never reused)."""
    if count is None:
        return None
    seen: dict[int, tuple[Any, int]] = {}

    def counted(obj: Any) -> int:
        hit = seen.get(id(obj))
        if hit is None:
            hit = seen[id(obj)] = (obj, count(obj))
        return hit[1]

    return counted


# ---------------------------------------------------------------------------------------------
def plan_requests(
    requests: list[ReplayRequest], config: TeachersConfig, cache: ResponseCache, ledger: Ledger
) -> CostPlan:
    rows = {name: [] for name in tables.COST_PLAN.names}
    ledger.check_identities(config.identities(), register=False)  # a name reused for another endpoint: refused first
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


PREDICT_BYTES_PER_TOKEN = 4.0  # typical bytes per token of English, code and JSON (the worst case assumes 1)
OPENAI_MIN_CACHED, OPENAI_CACHE_STEP = 1024, 128  # platform.openai.com/docs/guides/prompt-caching


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
            if r.skip_reason is not None:  # never sent: costs nothing, and the next one cannot read it
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
    remaining = {  # money in flight may come back; money held by live batches not soon
        t.name: max(0.0, ledger.room(t.name, t.budget_usd) - held.get(t.name, 0.0)) for t in config.teachers
    }
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
        if column not in plan.column_names:  # a plan written before this column existed
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


# ---------------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _row(r: ReplayRequest, res: CallResult) -> dict[str, Any]:
    return {
        "call_id": r.call_id,
        "state_id": r.state_id,
        "session_key": r.session_key,
        "teacher": r.teacher.name,
        "model": r.teacher.model,
        "status": res.status,
        "reason": res.reason,
        "action": res.action.to_json() if res.action is not None else None,
        "raw_answer": res.raw_answer,
        "cost_usd": float(res.cost_usd),
        "paid_usd": 0.0 if res.cache_hit else float(res.cost_usd),
        "reserved_usd": float(res.reserved_usd),
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens,
        "latency_s": res.latency_s,
        "attempts": res.attempts,
        "cache_hit": res.cache_hit,
        "created_at": _now(),
        "cached_tokens": res.cached_tokens,
        "cache_write_tokens": res.cache_write_tokens,
        "elided_messages": max(res.elided_messages, r.elided_messages),
        "cut_messages": max(res.cut_messages, r.cut_messages),
        "finish_reason": res.finish_reason,
    }


SKIPPED = ("no_user_turn", "not_escalated")  # never sent by design: status skipped, not a failure


def _skipped(reason: str) -> CallResult:
    return CallResult(status="skipped" if reason.startswith(SKIPPED) else "failed", reason=reason)


def _from_cache(rec: dict[str, Any], teacher: TeacherConfig) -> CallResult:
    res = answer_from_response(rec["response"], teacher)
    res.cost_usd = float(rec.get("cost_usd") or 0.0)  # what it cost when bought; this run pays 0 (paid_usd)
    res.latency_s = rec.get("latency_s")
    res.cache_hit = True
    return res


def _cache_get(cache: ResponseCache, cid: str) -> dict[str, Any] | None:
    try:
        return cache.get(cid)
    except OSError:  # an unreadable cache is a miss; the ledger still has every paid answer
        return None


def _too_long(res: CallResult) -> bool:
    return res.status == "failed" and (res.reason or "").startswith("context_length_exceeded")


@dataclass
class _Run:
    """One replay's shared state under the money rules, one idea per method: :meth:`serve_cached` and
    :meth:`served_unbought` answer without buying; :meth:`buy` claims the call id (again after
    :class:`ClaimLost`: a run paused past its lease re-claims before it buys) and serves an answer another run
    bought meanwhile; :meth:`bought` buys it under the claim (a failure releases the claim);
    :meth:`one` buys an identical request once per run; :func:`_replay` is the loop over the waves."""

    requests: list[ReplayRequest]
    config: TeachersConfig
    api_keys: dict[str, str | None]
    cache: ResponseCache
    aledger: AsyncLedger
    run_id: str
    progress: Callable[[int, int], None] | None
    sems: dict[str, asyncio.Semaphore]
    guards: dict[str, TeacherGuard]
    clients: dict[str, httpx.AsyncClient]
    results: list[CallResult | None]
    first: dict[str, asyncio.Future] = field(default_factory=dict)  # call_id -> its first occurrence's result
    legacy_answered: set[str] = field(default_factory=set)  # legacy ids of uncached requests the ledger answered
    done: int = 0
    shared: int = 0  # answers another run bought while this one waited for its claim

    @classmethod
    def open(cls, requests, config, api_keys, cache, ledger, run_id, progress) -> "_Run":
        aledger = AsyncLedger(ledger, run_id, config.lease_s, spool=cache.dir / "unrecorded")
        return cls(
            requests,
            config,
            api_keys,
            cache,
            aledger,
            run_id,
            progress,
            sems={t.name: asyncio.Semaphore(t.max_concurrency) for t in config.teachers},
            guards={t.name: TeacherGuard(config.max_invalid_responses) for t in config.teachers},
            clients={t.name: make_http_client(t) for t in config.teachers},
            results=[None] * len(requests),
        )

    async def start(self, ledger: Ledger) -> None:
        """Opens the ledger run; notes which uncached requests the ledger answered under their legacy id."""
        # one identity per teacher name on this ledger (registered by the first run that uses it)
        await self.aledger._run(ledger.check_identities, self.config.identities())
        await self.aledger.start()
        uncached = [r for r in self.requests if not self.cache.path(r.call_id).is_file()]
        self.legacy_answered = await self.aledger._run(ledger.answered_ids, sorted({_legacy_id(r) for r in uncached}))

    async def close(self, note: str) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients.values()), return_exceptions=True)
        await self.aledger.finish(note)  # anything still open is released (never sent) or kept (sent)

    def info(self) -> RunInfo:
        disabled = {n: g.disabled_reason for n, g in self.guards.items() if g.disabled_reason}
        return RunInfo(self.aledger.waits, self.shared, disabled)

    async def send(self, wave: list[int]) -> None:
        if self.config.scheduling == "stream":
            # session-affine: one task per (teacher, stream) sends its states in order, each after the previous
            # one's answer, so each request can read the prefix the previous one wrote to the provider's cache
            part = [self.requests[i] for i in wave]
            await asyncio.gather(*(self.in_order([wave[j] for j in idx]) for idx in stream_groups(part)))
        else:
            await asyncio.gather(*(self.one(i, self.requests[i]) for i in wave))

    async def in_order(self, idx: list[int]) -> None:
        for i in idx:
            await self.one(i, self.requests[i])

    async def one(self, i: int, r: ReplayRequest) -> None:
        """Row ``i``: bought by the first occurrence of its call id in this run, repeated by the others."""
        res = await self.repeat(r) if r.call_id in self.first else await self.first_buy(r)
        self.results[i] = res
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, len(self.requests))

    async def repeat(self, r: ReplayRequest) -> CallResult:
        """An identical request already in this run: never pay twice."""
        prev: CallResult = await self.first[r.call_id]
        if prev.status == "answered":
            return dataclasses.replace(prev, cache_hit=True)
        # its failure is reported once with its cost; this row repeats the verdict at no cost
        return dataclasses.replace(prev, cost_usd=0.0, reserved_usd=0.0, attempts=0)

    async def first_buy(self, r: ReplayRequest) -> CallResult:
        fut = self.first[r.call_id] = asyncio.get_running_loop().create_future()
        try:
            res = await self.buy(r)
        except Exception as e:  # a bug or a ledger failure: recorded, never a lost row
            res = CallResult(status="failed", reason=f"internal_error: {type(e).__name__}: {str(e)[:200]}")
        fut.set_result(res)
        return res

    async def repair_cache(self, cid: str, rec: dict[str, Any]) -> None:
        """Puts a paid answer from the ledger back into the cache (an unwritable cache: the ledger keeps it)."""
        try:
            await asyncio.to_thread(self.cache.put, cid, rec)
        except OSError:
            pass

    def serve_cached(self, r: ReplayRequest) -> CallResult | None:
        rec = _cache_get(self.cache, r.call_id) or _cache_get(self.cache, _legacy_id(r))
        return None if rec is None else _from_cache(rec, r.teacher)

    async def paid_answer(self, r: ReplayRequest) -> dict[str, Any] | None:
        """The answer this request already has in the ledger (bought by any run, also under its legacy id)."""
        rec = await self.aledger.answer(r.call_id)
        if rec is None and _legacy_id(r) in self.legacy_answered:
            rec = await self.aledger.answer(_legacy_id(r))
        if rec is not None:
            await self.repair_cache(r.call_id, rec)
        return rec

    async def served_unbought(self, r: ReplayRequest, key: str | None) -> CallResult | None:
        """What a request gets when nothing is to be bought: its paid answer from the ledger (served without a
        key, also from a cut-off teacher), else the missing key or the teacher's cut-off as its failure."""
        t = r.teacher
        missing_key = bool(t.api_key_env and not key)
        disabled = self.guards[t.name].disabled_reason
        if missing_key or disabled or _legacy_id(r) in self.legacy_answered:
            rec = await self.paid_answer(r)
            if rec is not None:
                return _from_cache(rec, t)
        if missing_key:
            return CallResult(
                status="failed", reason=f"missing_api_key: environment variable {t.api_key_env} is not set"
            )
        disabled = self.guards[t.name].disabled_reason  # read again: another call may have cut it off meanwhile
        if disabled:
            return CallResult(status="failed", reason=disabled)
        return None

    async def buy(self, r: ReplayRequest) -> CallResult:
        """A cache or ledger hit is served; else the call id is claimed and bought, claimed again when this run
        lost the claim while paused past its lease (:class:`ClaimLost`)."""
        cached = self.serve_cached(r)
        if cached is not None:
            return cached
        key = self.api_keys.get(r.teacher.name)
        unbought = await self.served_unbought(r, key)
        if unbought is not None:
            return unbought
        while True:
            claim = await self.aledger.claim(r.call_id, r.teacher.name)  # waits while another live run buys it
            if claim.state == "answered":
                self.shared += 1
                await self.repair_cache(r.call_id, claim.record)
                return _from_cache(claim.record, r.teacher)
            if claim.state == "batched":  # never bought twice: the batch's answer is collected in batch mode
                return CallResult(
                    status="failed", reason=f"batch_pending: held by {claim.owner}; replay --mode batch collects it"
                )
            try:
                return await self.bought(r, key)
            except ClaimLost:
                continue

    async def bought(self, r: ReplayRequest, key: str | None) -> CallResult:
        """The request bought under this run's claim; a failure (or a bug) releases the claim."""
        try:
            res = await self.call(r, key, r.body, r.cache_hint)
            if _too_long(res):
                res = await self.refitted(r, key, res)
        except ClaimLost:
            raise  # not this run's claim any more: nothing to fail
        except Exception as e:
            await self.aledger.fail_claim(r.call_id, f"internal_error: {type(e).__name__}")
            raise
        if res.status != "answered":
            await self.aledger.fail_claim(r.call_id, res.reason or res.status)
        return res

    async def refitted(self, r: ReplayRequest, key: str | None, res: CallResult) -> CallResult:
        """After a context-length answer (not billed; the provider counts more tokens than the fit did): one
        tighter refit, then the request is over its window."""
        t = r.teacher
        tighter = refit(r)
        if tighter is not None:
            hint = dataclasses.replace(r.cache_hint, read_through=None) if r.cache_hint else None
            again = await self.call(r, key, tighter.body, hint)
            again.attempts += res.attempts
            again.cost_usd += res.cost_usd
            again.reserved_usd += res.reserved_usd
            again.elided_messages, again.cut_messages = tighter.elided_messages, tighter.cut_messages
            res = again
        if _too_long(res):
            res.reason = (
                f"over_context_window: {'refitted once, ' if tighter is not None else ''}still too long for "
                f"{t.name} (context_window {t.context_window}): {res.reason}"
            )
        return res

    async def call(self, r: ReplayRequest, key: str | None, body: dict, cache_hint: CacheHint | None) -> CallResult:
        """One priced, ledgered call of the request's teacher (:func:`call_teacher`)."""
        t = r.teacher
        return await call_teacher(
            self.clients[t.name],
            t,
            key,
            body,
            r.call_id,
            ledger=self.aledger,
            cache=self.cache,
            run_id=self.run_id,
            ceiling_usd=self.config.ceiling_usd,
            semaphore=self.sems[t.name],
            guard=self.guards[t.name],
            cache_key=stream_cache_key(r.stream_id),
            cache_hint=cache_hint,
        )


async def _replay(
    requests: list[ReplayRequest],
    config: TeachersConfig,
    api_keys: dict[str, str | None],
    cache: ResponseCache,
    ledger: Ledger,
    run_id: str,
    progress: Callable[[int, int], None] | None,
    escalation: Escalation | None = None,
) -> tuple[list[CallResult | None], RunInfo]:
    """The requests sent wave by wave (escalation tiers, in order; else one wave of all) in one ledger run;
    each wave's results are in before the next wave is chosen. None: a request of a tier its state never
    reached (escalation)."""
    # a pasted key's trailing newline: stripped; a broken key: refused, nothing reserved
    api_keys = clean_api_keys(config, api_keys)
    ledger.outage_s = config.ledger_outage_s
    run = _Run.open(requests, config, api_keys, cache, ledger, run_id, progress)
    note = "run ended"
    try:
        await run.start(ledger)
        for wave in waves(requests, run.results, escalation):
            await run.send(wave)
    except asyncio.CancelledError:
        note = "run interrupted"
        raise
    finally:
        await run.close(note)
    return run.results, run.info()


def _extends(msgs: list[dict], prev: list[dict] | None) -> bool:
    return prev is not None and len(msgs) >= len(prev) and msgs[: len(prev)] == prev


def with_cache_hints(requests: list[ReplayRequest]) -> list[ReplayRequest]:
    """Each request with its :class:`CacheHint`: per teacher and stream, in stream order, whether it extends
    the previous request (then it reads through that request's messages) and whether a later request of the
    stream follows (then what it sends is worth writing to the cache). Used for ``api: anthropic``, where
    writes cost 1.25× and breakpoints say where to read."""
    out = list(requests)
    for idx in stream_groups(requests):
        prev: list[dict] | None = None
        for n, i in enumerate(idx):
            msgs = requests[i].body.get("messages") or []
            hint = CacheHint(len(prev) if _extends(msgs, prev) else None, write=n < len(idx) - 1)
            out[i] = dataclasses.replace(requests[i], cache_hint=hint)
            prev = msgs
    return out


def stream_groups(requests: list[ReplayRequest]) -> list[list[int]]:
    """Indices of ``requests`` per (teacher, stream), each in stream order (prefix length, then input order);
    a request without a stream is a group of its own."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        groups[(r.teacher.name, r.stream_id or f"#{i}")].append(i)
    return [sorted(idx, key=lambda i: (requests[i].order, i)) for idx in groups.values()]


async def _with_signals(coro):
    """Run ``coro``; SIGTERM/SIGINT cancel it (its ``finally`` closes the ledger run) → :class:`ReplayInterrupted`."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    got: list[int] = []
    installed: dict[int, Any] = {}  # signal -> the handler it had (Dagster's, pytest's...): put back afterwards
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(sig)
            loop.add_signal_handler(
                sig, lambda s=sig: got or (got.append(s), task.cancel())
            )  # once: let finally finish
            installed[sig] = previous
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (e.g. inside a Dagster step)
            pass
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            raise ReplayInterrupted(got[0]) from None
        raise
    finally:
        for sig, previous in installed.items():
            loop.remove_signal_handler(sig)  # sets SIG_DFL / default_int_handler, not the previous handler
            if previous is not None:
                signal.signal(sig, previous)


def replay_requests(
    requests: list[ReplayRequest],
    config: TeachersConfig,
    api_keys: dict[str, str | None],
    *,
    cache: ResponseCache,
    ledger: Ledger,
    run_id: str,
    progress: Callable[[int, int], None] | None = None,
    extra_failed: Iterable[tuple[str, str | None, str]] = (),
    escalation: Escalation | None = None,
) -> ReplayResult:
    """Replay pre-built requests; ``extra_failed`` = (state_id, session_key, reason) rows for every teacher;
    ``escalation``: the teachers recipe's tiers, sent tier by tier (:mod:`escalation`)."""
    requests = with_cache_hints(requests)
    # a request that cannot fit its teacher's window, or whose prefix has no user turn, is never sent: its row
    # says why (over_context_window, no_user_turn)
    sent = [r for r in requests if r.skip_reason is None]
    results, info = asyncio.run(
        _with_signals(_replay(sent, config, api_keys, cache, ledger, run_id, progress, escalation))
    )
    if progress is not None and escalation is not None and any(r is None for r in results):
        progress(len(sent), len(sent))  # the tiers not reached are decided too (their rows say not_escalated)
    answers = iter(results)
    rows = []
    for r in requests:
        res = next(answers) if r.skip_reason is None else _skipped(r.skip_reason)
        if res is None:  # its state never reached this teacher's tier
            res = _skipped(escalation.reason(r.state_id) if escalation is not None else "not_escalated")
        rows.append(_row(r, res))
    for sid, skey, reason in extra_failed:
        for t in config.teachers:
            stub = ReplayRequest(sid, skey, t, {}, "", 0, 0.0)  # the fit fields keep their defaults
            rows.append(_row(stub, CallResult(status="failed", reason=reason)) | {"call_id": None})
    table = tables.conform(pa.Table.from_pylist(rows, schema=tables.TEACHER_REPLAYS), "teacher_replays")
    return ReplayResult(table, replay_summary(table, info))


@dataclass
class ReplayRun:
    """One replay of a set of trace states: THE entry of ``composer-pipeline replay`` and of the
    ``cost_plan`` / ``teacher_replays`` assets, so both front ends render, price and send alike.

    ``prepare`` renders every state × teacher request once (a state that fails to render is kept as a
    failed row per teacher); :meth:`plan` prices them (``cost_plan`` and the fit decision);
    :meth:`replay` sends them (``teacher_replays`` and :func:`run_report.replay_summary`).
    """

    config: TeachersConfig
    requests: list[ReplayRequest]
    unrendered: list[tuple[str, str | None, str]]  # (state_id, session_key, reason)
    agents: dict[str, str] = field(default_factory=dict)  # state_id -> the agent's action (escalation decides by it)

    @classmethod
    def prepare(cls, states: pa.Table, messages: pa.Table, config: TeachersConfig, render_opts) -> "ReplayRun":
        requests, unrendered = build_requests(states, messages, config, render_opts)
        agents = dict(zip(states.column("state_id").to_pylist(), states.column("action").to_pylist()))
        return cls(config, requests, unrendered, agents)

    def plan(self, cache: ResponseCache, ledger: Ledger) -> CostPlan:
        """Worst-case cost of these requests, net of what the cache and the ledger already hold."""
        return plan_requests(self.requests, self.config, cache, ledger)

    def replay(
        self,
        api_keys: dict[str, str | None],
        *,
        cache: ResponseCache,
        ledger: Ledger,
        run_id: str,
        progress: Callable[[int, int], None] | None = None,
        pair_recipe: PairRecipe | None = None,
    ) -> ReplayResult:
        """Ask every teacher for the next action at every state; one row per state × teacher. With the
        config's ``escalation``, tier by tier, decided with ``pair_recipe`` (None: the packaged pairs recipe)."""
        return replay_requests(
            self.requests,
            self.config,
            api_keys,
            cache=cache,
            ledger=ledger,
            run_id=run_id,
            progress=progress,
            extra_failed=self.unrendered,
            escalation=Escalation.of(self.config, self.agents, pair_recipe),
        )
