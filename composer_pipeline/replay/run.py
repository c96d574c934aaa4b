"""Multi-teacher replay: every trace state × every teacher → one ``teacher_replays`` row.

In:  ``trace_states`` + ``trace_messages`` tables, a :class:`TeachersConfig`, API keys as values,
     render options, a :class:`ResponseCache` and a :class:`Ledger`.
Out: :class:`ReplayRun` (what the CLI and the assets run, through ``replay/front.py``): ``prepare`` renders the requests,
     ``.plan`` → :class:`CostPlan` (schema ``cost_plan``: worst case per call, what the cache already
     holds, whether it fits the budgets and the run ceiling), ``.replay`` → :class:`ReplayResult` (schema
     ``teacher_replays`` + :func:`report.replay_summary`). ``make_request`` / ``plan_requests`` /
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.ledger import AsyncLedger, ClaimLost, Ledger, ReplayInterrupted
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.replay.call import (
    CallResult,
    TeacherGuard,
    answer_from_response,
    call_teacher,
    make_http_client,
    stream_cache_key,
)
from composer_pipeline.replay.escalation import Escalation, waves
from composer_pipeline.replay.plan import CostPlan, _cache_get, plan_requests
from composer_pipeline.replay.report import RunInfo, replay_summary
from composer_pipeline.replay.requests import (
    ReplayRequest,
    _legacy_id,
    build_requests,
    refit,
    stream_groups,
    with_cache_hints,
)
from composer_pipeline.teachers.anthropic import CacheHint
from composer_pipeline.teachers.cache import (
    ResponseCache,
)
from composer_pipeline.teachers.config import TeacherConfig, TeachersConfig, clean_api_keys


@dataclass
class ReplayResult:
    table: pa.Table  # schema teacher_replays
    summary: dict[str, Any] = field(default_factory=dict)  # run_report.replay_summary


# ---------------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


# never sent by design: status skipped, not a failure
SKIPPED = ("no_user_turn", "not_escalated")


def _skipped(reason: str) -> CallResult:
    return CallResult(status="skipped" if reason.startswith(SKIPPED) else "failed", reason=reason)


def _from_cache(rec: dict[str, Any], teacher: TeacherConfig) -> CallResult:
    res = answer_from_response(rec["response"], teacher)
    # what it cost when bought; this run pays 0 (paid_usd)
    res.cost_usd = float(rec.get("cost_usd") or 0.0)
    res.latency_s = rec.get("latency_s")
    res.cache_hit = True
    return res


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
    # call_id -> its first occurrence's result
    first: dict[str, asyncio.Future] = field(default_factory=dict)
    # legacy ids of uncached requests the ledger answered
    legacy_answered: set[str] = field(default_factory=set)
    done: int = 0
    # answers another run bought while this one waited for its claim
    shared: int = 0

    @classmethod
    def open(cls, requests, config, api_keys, cache, ledger, run_id, progress) -> _Run:
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
        # anything still open is released (never sent) or kept (sent)
        await self.aledger.finish(note)

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
        # a bug or a ledger failure: recorded, never a lost row
        except Exception as e:
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
        # read again: another call may have cut it off meanwhile
        disabled = self.guards[t.name].disabled_reason
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
                if claim.record is None:
                    raise RuntimeError(f"the ledger's claim on {r.call_id} is answered but holds no answer")
                self.shared += 1
                await self.repair_cache(r.call_id, claim.record)
                return _from_cache(claim.record, r.teacher)
            # never bought twice: the batch's answer is collected in batch mode
            if claim.state == "batched":
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
            # not this run's claim any more: nothing to fail
            raise
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


async def _with_signals(coro):
    """Run ``coro``; SIGTERM/SIGINT cancel it (its ``finally`` closes the ledger run) → :class:`ReplayInterrupted`."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    got: list[int] = []
    installed: dict[
        signal.Signals, Any
        # signal -> the handler it had (Dagster's, pytest's...): put back afterwards
    ] = {}

    def interrupt(sig: int) -> None:
        # once: let finally finish
        if not got:
            got.append(sig)
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(sig)
            loop.add_signal_handler(sig, interrupt, sig)
            installed[sig] = previous
        # not the main thread (e.g. inside a Dagster step)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            raise ReplayInterrupted(got[0]) from None
        raise
    finally:
        for sig, previous in installed.items():
            # sets SIG_DFL / default_int_handler, not the previous handler
            loop.remove_signal_handler(sig)
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
        # the tiers not reached are decided too (their rows say not_escalated)
        progress(len(sent), len(sent))
    answers = iter(results)
    rows = []
    for r in requests:
        res = next(answers) if r.skip_reason is None else _skipped(r.skip_reason)
        # its state never reached this teacher's tier
        if res is None:
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
    # state_id -> the agent's action (escalation decides by it)
    agents: dict[str, str] = field(default_factory=dict)

    @classmethod
    def prepare(cls, states: pa.Table, messages: pa.Table, config: TeachersConfig, render_opts) -> ReplayRun:
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
