"""One teacher call over HTTP with retries, money reservations and the response cache.

In:  a :class:`TeacherConfig`, its API key (a value; may be ``None`` for local servers), the request
     body and its ``call_id``, an ``httpx.AsyncClient`` per teacher, a semaphore, the ledger, the cache.
Out: a :class:`CallResult`: answered (with the parsed action or the raw answer and the parse error, and
     the provider's ``finish_reason``; an answer cut at its token limit says so), refused (the refusal's
     text kept), failed (with a reason) or budget_exhausted. It never raises for a teacher's misbehaviour.

Per attempt (:meth:`_Call.attempt`): reserve the worst case (refused → ``budget_exhausted``, nothing sent),
POST (:func:`_post`), then

* 200 + JSON with usage → settle (:meth:`_Call.settle_answer`) at reported usage × prices, never above the
  reservation (``pricing.settle``: a usage beyond ``max_tokens`` or the prompt sent is clamped and flagged
  ``usage_over_bound`` with the claim and the excess), write the cache, parse the answer;
* 200 + JSON without usable usage (missing; negative, fractional or non-numeric counts: ``usage_invalid``)
  → keep the reservation (worst case counted), still an answer;
* 429 / 408 / 5xx error response → release, back off (``Retry-After`` honoured), retry;
* 400 naming a parameter the model refuses (:func:`unsupported_param`: ``temperature``, ``top_p``...; OpenAI
  reasoning models' ``max_tokens``) → release, remember it for the run (the teacher's guard; logged once),
  send again at once without it (``max_tokens`` renamed ``max_completion_tokens``, never dropped); outside
  ``max_retries``, and never twice for one parameter;
* other 4xx → release, fail (no retry);
* connect error (nothing sent) → release, retry;
* the request cannot be formed (a header value HTTP forbids; nothing sent) → release, fail (no retry);
* timeout, connection dropped before or while reading the body → keep (may be billed), retry;
* any other transport error (decoding, protocol, proxy) → keep, fail (no retry);
* 200 with a body that is not JSON / lacks ``choices[0].message`` → keep, fail (no retry); after
  ``TeacherGuard.limit`` such answers in a row the teacher is cut off for the rest of the run.

A reservation that has to wait for money in flight waits (the ledger decides, see ``ledger/core.py``);
every reservation is marked *sent* just before the request leaves, so a run killed mid-call leaves
it kept at its worst case while one killed before sending has it released.

The retry loop (:func:`call_teacher`) is bounded by ``max_retries``; backoff is exponential with full jitter
(``uniform(0, min(backoff_max_s, backoff_s · 2^n))``, the AWS "full jitter" scheme).

The key is only ever placed in the ``Authorization`` header; the whole response and any reason text
derived from a response or an exception have it removed (as written, JSON-, URL- and repr-escaped:
``redact.py``) before anything is cached, stored or logged. A teacher's answer (and any error text) also goes
through the ingest secret scrubber before it is cached, stored or logged: a teacher that echoes or
invents a key does not put it on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import orjson

from composer_pipeline.actions import Action, ActionParseError, parse_chat_message
from composer_pipeline.ledger import AsyncLedger, LedgerError, Reserve
from composer_pipeline.scrub import scrub_obj
from composer_pipeline.tables import CUT_FINISH_REASONS
from composer_pipeline.teachers import anthropic
from composer_pipeline.teachers.cache import ResponseCache, canonical_json, without_error_marks
from composer_pipeline.teachers.config import TeacherConfig
from composer_pipeline.teachers.pricing import (
    Settlement,
    billed,
    max_completion_tokens,
    settle,
    usage_cost,
    worst_case_usd,
)
from composer_pipeline.teachers.redact import redact_key, redact_text

# a provider's answer that the prompt is longer than its window (HTTP 400, not billed): OpenAI-style
# ``context_length_exceeded``, Anthropic ``prompt is too long``; replay refits once, then skips the state
CONTEXT_EXCEEDED_RE = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|context window", re.I
)

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
MAX_RETRY_AFTER_S = 300.0


@dataclass
class CallResult:
    status: str  # answered | failed | budget_exhausted
    reason: str | None = None
    action: Action | None = None
    raw_answer: str | None = None
    cost_usd: float = 0.0
    reserved_usd: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    attempts: int = 0
    cache_hit: bool = False
    # prompt tokens the provider billed as cache reads
    cached_tokens: int | None = None
    # prompt tokens it billed as cache writes (Anthropic)
    cache_write_tokens: int | None = None
    # messages the fitted prefix replaced by its marker (render.fit_messages)
    elided_messages: int = 0
    # messages whose content was cut in the middle to fit
    cut_messages: int = 0
    # the provider's stop reason, in its word (stop, length, end_turn, max_tokens...)
    finish_reason: str | None = None


def make_http_client(teacher: TeacherConfig) -> httpx.AsyncClient:
    """Connection-reusing client sized to the teacher's concurrency."""
    limits = httpx.Limits(max_connections=teacher.max_concurrency, max_keepalive_connections=teacher.max_concurrency)
    timeout = httpx.Timeout(teacher.timeout_s, connect=min(teacher.timeout_s, 30.0), pool=None)
    # base_url's user info, kept out of base_url (config.py), goes only here: basic auth on the wire
    auth = httpx.BasicAuth(*teacher.basic_auth) if teacher.basic_auth else None
    return httpx.AsyncClient(limits=limits, timeout=timeout, follow_redirects=False, trust_env=False, auth=auth)


def _retry_after(resp_headers: httpx.Headers) -> float | None:
    v = resp_headers.get("retry-after")
    if not v:
        return None
    try:
        return max(0.0, min(float(v), MAX_RETRY_AFTER_S))
    except ValueError:
        pass
    try:
        dt = parsedate_to_datetime(v)
        return max(0.0, min(dt.timestamp() - time.time(), MAX_RETRY_AFTER_S))
    except (TypeError, ValueError):
        return None


def backoff_delay(teacher: TeacherConfig, attempt: int, retry_after: float | None) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based)."""
    if retry_after is not None:
        return retry_after + random.uniform(0, 0.1 * max(retry_after, 0.1))
    return random.uniform(0, min(teacher.backoff_max_s, teacher.backoff_s * 2 ** (attempt - 1)))


def _scrub(text: str, api_key: str | None, limit: int = 300) -> str:
    """Reason text from a response or an exception, at most ``limit`` characters: without the teacher's
    key (in any encoding, see ``redact.py``) or any other secret. Redacted first, then cut (a key cut
    in half by the limit would match neither); only a window the limit's keys can reach is scanned."""
    # (a key starting before ``limit`` ends inside it)
    window = limit + 4096 + 8 * len(api_key or "")
    text = scrub_obj(redact_text(text[:window], api_key))
    return " ".join(text.split())[:limit]


def _clean_answer(data: Any, api_key: str | None) -> Any:
    """A parsed response without secrets by their look, nor the key this request carried by its value
    (wherever the teacher echoed it); run off the event loop: a long answer takes a while."""
    return redact_key(scrub_obj(data), api_key)


def raw_answer_of(message: dict[str, Any]) -> str:
    """The answer as received: its content text, or the message JSON when it carries native tool calls."""
    content = message.get("content")
    if message.get("tool_calls"):
        return orjson.dumps({"content": content, "tool_calls": message["tool_calls"]}).decode()
    if isinstance(content, str):
        return content
    return orjson.dumps(content).decode()


def answer_from_response(data: dict[str, Any], teacher: TeacherConfig) -> CallResult:
    """Turn a cached or fresh chat-completions JSON into a result: answered (parse errors kept; an answer cut
    at its token limit says so in ``reason``) or refused (OpenAI ``message.refusal``, Anthropic
    ``stop_reason: refusal``: the refusal's text kept as ``raw_answer``)."""
    choice = data["choices"][0]
    message = choice["message"]
    finish = choice.get("finish_reason")
    finish = None if finish is None else str(finish)[:40]
    p, c, _ = usage_cost(data.get("usage"), teacher)
    res = CallResult(
        status="answered",
        raw_answer=raw_answer_of(message),
        prompt_tokens=p,
        completion_tokens=c,
        finish_reason=finish,
    )
    b = billed(data.get("usage"), teacher)
    if b is not None:
        res.cached_tokens, res.cache_write_tokens = b.cached_tokens, b.cache_write_tokens
    refusal = message.get("refusal")
    if (isinstance(refusal, str) and refusal) or finish == "refusal":
        res.status, res.reason = "refused", f"refused: finish_reason {finish}"
        res.raw_answer = refusal if isinstance(refusal, str) and refusal else res.raw_answer
        return res
    try:
        action = parse_chat_message(message)
    except ActionParseError as e:
        res.reason = f"unparseable: {e}"
        return res
    res.action = action
    if finish in CUT_FINISH_REASONS:
        res.reason = f"cut_off: finish_reason {finish} (the answer hit its token limit; it never votes)"
    elif action.is_empty:
        res.reason = "empty_answer: no text and no tool calls"
    return res


def _valid_completion(data: Any) -> str | None:
    """None when ``data`` is a usable chat completion, else what is wrong with it."""
    if not isinstance(data, dict):
        return "body is not a JSON object"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        err = data.get("error")
        return f"no choices{': error ' + str(err)[:200] if err else ''}"
    if not isinstance(choices[0].get("message"), dict):
        return "choices[0].message missing"
    return None


@dataclass
class TeacherGuard:
    """Per run and teacher: cut a teacher off after ``limit`` consecutive invalid responses (HTML, non-JSON,
    no choices). Each such response may be billed at its worst case, so a broken endpoint must not be
    asked thousands of times."""

    limit: int = 3
    consecutive: int = 0
    disabled_reason: str | None = None
    last_problem: str = ""
    # parameters this teacher's model refused with a 400 in this run -> what it said (client.unsupported_param)
    unsupported: dict[str, str] = field(default_factory=dict)

    def invalid(self, problem: str) -> None:
        self.consecutive += 1
        self.last_problem = problem
        if self.consecutive >= self.limit and self.disabled_reason is None:
            self.disabled_reason = (
                f"teacher_disabled: {self.consecutive} consecutive invalid responses (last: {problem[:160]})"
            )

    def valid(self) -> None:
        self.consecutive = 0


def stream_cache_key(stream_id: str | None) -> str | None:
    """``prompt_cache_key`` for a stream: a hash (the stream id names a project and a session; never sent)."""
    if not stream_id:
        return None

    return "cp-" + hashlib.sha256(f"composer-pipeline|{stream_id}".encode()).hexdigest()[:32]


def wire_body(
    teacher: TeacherConfig,
    body: dict[str, Any],
    cache_key: str | None = None,
    cache_hint: anthropic.CacheHint | None = None,
) -> dict[str, Any]:
    """What goes on the wire for ``body`` (the hashed request): the Messages API body for ``api: anthropic``;
    for OpenAI-style teachers the body plus ``prompt_cache_key`` when the teacher sends it. Neither changes
    the ``call_id``: a cached answer stays found whatever the transport adds."""
    if teacher.api == "anthropic":
        return anthropic.to_messages_request(body, hint=cache_hint)
    # OpenAI's tool messages have no is_error
    body = without_error_marks(body)
    if cache_key and teacher.prompt_cache_key:
        return {**body, "prompt_cache_key": cache_key}
    return body


def _host(teacher: TeacherConfig) -> str:
    u = httpx.URL(teacher.base_url)
    return f"{u.host}:{u.port}" if u.port else str(u.host)


# Parameters a model may refuse that the request can do without (a 400 naming one is retried once without
# it); ``max_tokens`` is never dropped, only renamed to ``max_completion_tokens`` (OpenAI reasoning models).
DROPPABLE_PARAMS = ("temperature", "top_p", "top_k", "seed", "prompt_cache_key")
_UNSUPPORTED_RE = re.compile(
    r"unsupported|not supported|deprecated|does not support|not allowed|unrecognized|extra inputs are not permitted",
    re.I,
)


def unsupported_param(raw: bytes, sent: dict[str, Any], api: str) -> str | None:
    """The parameter a 400 answer says this model does not take, when the request sent it and can do without
    it (OpenAI ``{"error": {"code": "unsupported_parameter" | "unsupported_value", "param": ...}}``; Anthropic
    ``"temperature is deprecated for this model."``); None for any other 400 (never retried)."""
    try:
        err = orjson.loads(raw).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(err, dict):
        return None
    message = str(err.get("message") or "")
    if not _UNSUPPORTED_RE.search(f"{err.get('code') or ''} {message}"):
        return None
    changeable = DROPPABLE_PARAMS + (("max_tokens",) if api == "openai" else ())
    named = [err["param"]] if isinstance(err.get("param"), str) else []
    named += [k for k in changeable if re.search(rf"\b{k}\b", message)]
    return next((k for k in named if k in changeable and k in sent), None)


def without_params(wire: dict[str, Any], params: dict[str, str]) -> dict[str, Any]:
    """``wire`` without the parameters this model refused (``max_tokens`` renamed ``max_completion_tokens``)."""
    out = dict(wire)
    for k in params:
        v = out.pop(k, None)
        if k == "max_tokens" and v is not None:
            out["max_completion_tokens"] = v
    return out


@dataclass
class _Reply:
    """What one POST came back with: a response (``status_code``, ``raw``) or a transport error (``reason``),
    and for an error what happens to the attempt's reservation (``release``: nothing was sent) and whether to
    try again."""

    status_code: int | None = None
    raw: bytes = b""
    headers: httpx.Headers | None = None
    latency_s: float = 0.0
    reason: str = ""
    release: bool = False
    retry: bool = False
    # a 400 named a parameter the model refuses: tried again at once without it
    adapted: bool = False


async def _post(
    http: httpx.AsyncClient, teacher: TeacherConfig, payload: bytes, headers: dict[str, str], api_key: str | None
) -> _Reply:
    """One POST; a transport error is classified by the table in the module docstring."""
    host = _host(teacher)
    t0 = time.perf_counter()
    status_code: int | None = None
    try:
        async with http.stream("POST", teacher.request_url, content=payload, headers=headers) as resp:
            status_code = resp.status_code
            raw = await resp.aread()
    except (httpx.LocalProtocolError, UnicodeEncodeError) as e:
        # the request could not be formed (e.g. a header value HTTP forbids): nothing left this process
        why = f"request_refused: {type(e).__name__} building the request to {host} (nothing was sent)"
        return _Reply(reason=why, release=True)
    except httpx.ConnectError as e:
        return _Reply(reason=f"connection_error: {type(e).__name__} connecting to {host}", release=True, retry=True)
    except httpx.ConnectTimeout:
        return _Reply(reason=f"connection_error: ConnectTimeout connecting to {host}", release=True, retry=True)
    except httpx.TimeoutException as e:
        return _Reply(reason=f"timeout: {type(e).__name__} after {teacher.timeout_s:g}s from {host}", retry=True)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        kind = "truncated_body" if status_code is not None else "connection_dropped"
        return _Reply(reason=f"{kind}: {type(e).__name__} from {host}: {_scrub(str(e), api_key, 120)}", retry=True)
    # protocol/decoding/proxy problems: sent, outcome unknown, not retried
    except httpx.HTTPError as e:
        return _Reply(reason=f"http_error: {type(e).__name__} from {host}: {_scrub(str(e), api_key, 120)}")
    return _Reply(status_code, raw, resp.headers, time.perf_counter() - t0)


def _error_reply(reply: _Reply, api_key: str | None) -> _Reply:
    """A non-200 answer: released (not billed); retried on 429 / 408 / 5xx (``Retry-After`` honoured)."""
    decoded = reply.raw.decode("utf-8", "replace")
    text = _scrub(decoded, api_key, 200)
    reply.reason = f"http_{reply.status_code}: {text}"
    if reply.status_code == 400 and CONTEXT_EXCEEDED_RE.search(decoded[:2000]):
        reply.reason = f"context_length_exceeded: {text}"  # not billed: released, refit by replay
    reply.release = True
    reply.retry = reply.status_code in RETRY_STATUS or (reply.status_code or 0) >= 500
    return reply


def _read_answer(raw: bytes, teacher: TeacherConfig, api_key: str | None) -> dict[str, Any] | str:
    """The answer as a chat completion, or (a string) what is wrong with the 200 body."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        head = _scrub(raw.decode("utf-8", "replace"), api_key, 60)
        return f"invalid_json: {len(raw)} bytes that do not parse as JSON ({head!r}...)"
    # before the cache, the ledger, the table and any log see it (the caller runs this off the event loop)
    data = _clean_answer(data, api_key)
    problem = anthropic.message_problem(data) if teacher.api == "anthropic" else None
    # the native answer, mapped to the one shape stored
    if teacher.api == "anthropic" and problem is None:
        data = anthropic.to_chat_completion(data)
    problem = problem or _valid_completion(data)
    return f"bad_response: {_scrub(problem, api_key)}" if problem else data


def _claim(usage: Any) -> str:
    """The provider's usage as received, for the record of a flagged settlement."""
    try:
        return orjson.dumps(usage).decode()[:500]
    except TypeError:
        return repr(usage)[:500]


def answer_record(
    t: TeacherConfig, data: dict[str, Any], s: Settlement, *, latency_s: float | None, attempts: int, run_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the answer as stored, its ledger/cache record) for a settled 200 answer, sync or batch. A flagged
    settlement keeps the provider's numbers beside the answer; the answer carries the settled ones."""
    flagged = s.flag is not None and not s.flag.startswith("no_usage")
    stored = data
    if flagged:
        stored = {k: v for k, v in data.items() if k != "usage"}
        if s.billed is not None:
            stored["usage"] = s.billed.usage()
    record = {
        "teacher": t.name,
        "model": t.model,
        "base_url": t.base_url.rstrip("/"),
        "response": stored,
        "cost_usd": s.cost_usd,
        "latency_s": latency_s,
        "attempts": attempts,
        "run_id": run_id,
        "received_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if flagged:
        record["usage_flag"], record["usage_claimed"] = s.flag, _claim(data.get("usage"))
    return stored, record


@dataclass
class _Call:
    """One request to one teacher under the money rules: :meth:`attempt` reserves, sends and closes its
    reservation; :meth:`settle_answer` settles a 200 answer; :func:`call_teacher` is the retry loop."""

    http: httpx.AsyncClient
    teacher: TeacherConfig
    api_key: str | None
    cid: str
    ledger: AsyncLedger
    cache: ResponseCache
    run_id: str
    ceiling_usd: float
    guard: TeacherGuard
    wire: dict[str, Any]
    prompt_bound: int
    completion_bound: int
    worst: float
    out: CallResult = field(default_factory=lambda: CallResult(status="failed"))
    last_reason: str = ""

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.teacher.api == "anthropic":
            h["anthropic-version"] = self.teacher.anthropic_version
            if self.api_key:
                h["x-api-key"] = self.api_key
        elif self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def stop(self, status: str, reason: str) -> CallResult:
        self.out.status, self.out.reason = status, reason
        return self.out

    async def attempt(self, n: int) -> CallResult | _Reply:
        """Attempt ``n``: a final result, or the reply of an attempt that produced no answer (its reservation
        already released or kept)."""
        t = self.teacher
        if self.guard.disabled_reason:
            return self.stop("failed", self.guard.disabled_reason)
        res = await self.ledger.reserve(
            Reserve(t.name, t.budget_usd, self.run_id, self.ceiling_usd, self.worst, self.cid)
        )
        if not res.ok:
            after = f" (after attempt {n - 1}: {self.last_reason})" if self.last_reason else ""
            return self.stop("budget_exhausted", f"budget_exhausted: {res.reason}{after}")
        # another call cut the teacher off while this one waited for money
        if self.guard.disabled_reason:
            await self.ledger.close(res.id, "released", note=self.guard.disabled_reason[:200])
            return self.stop("failed", self.guard.disabled_reason)
        self.out.reserved_usd += self.worst
        self.out.attempts = n
        wire = without_params(self.wire, self.guard.unsupported)
        await self.ledger.mark_sent(res.id)
        reply = await _post(self.http, t, canonical_json(wire), self.headers(), self.api_key)
        if reply.status_code == 200:
            answer = await asyncio.to_thread(_read_answer, reply.raw, t, self.api_key)
            if isinstance(answer, dict):
                self.guard.valid()
                return await self.settle_answer(res.id, answer, reply.latency_s, n)
            problem = answer
            await self.ledger.close(res.id, "kept", note=problem[:200])
            self.out.cost_usd += self.worst
            self.guard.invalid(problem)
            return self.stop("failed", problem)
        if reply.status_code is not None:
            reply = _error_reply(reply, self.api_key)
            self.learn(reply, wire)
        self.last_reason = reply.reason
        if reply.release:
            await self.ledger.close(res.id, "released", note=reply.reason[:200])
        else:
            await self.ledger.close(res.id, "kept", note=reply.reason[:200])
            self.out.cost_usd += self.worst
        return reply

    def learn(self, reply: _Reply, wire: dict[str, Any]) -> None:
        """A 400 naming a parameter this model refuses: remembered for the run (this teacher's guard), logged,
        and the request tried again once without it (``reply.retry``, outside ``max_retries``)."""
        if reply.status_code != 400:
            return
        param = unsupported_param(reply.raw, wire, self.teacher.api)
        if param is None:
            return
        said = reply.reason.split(": ", 1)[-1][:160]
        if param not in self.guard.unsupported:
            self.guard.unsupported[param] = said
            change = "sent as max_completion_tokens" if param == "max_tokens" else "no longer sent"
            log.warning(
                "teacher %s (model %s) refuses %s: %s; %s for the rest of this run",
                self.teacher.name,
                self.teacher.model,
                param,
                said,
                change,
            )
        reply.retry = reply.adapted = True
        reply.reason = f"unsupported_parameter: {param}: {said}"

    async def settle_answer(self, rid: str, data: dict[str, Any], latency: float, n: int) -> CallResult:
        """A paid answer: settled within its reservation (pricing.settle), stored in the ledger with its settle
        (one transaction), then in the cache; a cache that cannot be written costs nothing but a note."""
        t = self.teacher
        s = settle(
            data.get("usage"),
            t,
            prompt_bound=self.prompt_bound,
            completion_bound=self.completion_bound,
            reserved_usd=self.worst,
        )
        stored, record = answer_record(t, data, s, latency_s=latency, attempts=n, run_id=self.run_id)
        flagged = "usage_flag" in record
        notes = [await self.record(rid, s, record)]
        notes.append(await self.cache_answer(record, ledger_failed=notes[0] is not None))
        ans = answer_from_response(stored, t)
        ans.cost_usd = self.out.cost_usd + s.cost_usd
        ans.reserved_usd, ans.attempts, ans.latency_s = self.out.reserved_usd, n, latency
        if s.flag and (flagged or ans.reason is None):
            notes.insert(0, s.flag)
        if flagged:
            log.warning("teacher %s: %s", t.name, s.flag)
        ans.reason = "; ".join(x for x in (ans.reason, *notes) if x) or None
        return ans

    async def record(self, rid: str, s: Settlement, record: dict[str, Any]) -> str | None:
        """The settle and the answer in the ledger; the note when the ledger could not record them."""
        try:
            if s.billed is None:
                await self.ledger.close(
                    rid, "kept", note=(s.flag or "no usable usage in response")[:300], answer=(self.cid, record)
                )
            else:
                await self.ledger.close(
                    rid,
                    "settled",
                    cost_usd=s.cost_usd,
                    note=(s.flag or "")[:300],
                    answer=(self.cid, record),
                    usage=s.billed.as_dict(),
                )
        except LedgerError as e:
            # paid, but the ledger could not record it (full disk, server gone past its outage limit): the
            # reservation stays open (sent: kept at worst case when the run is finalized) and the answer goes to
            # the cache, so a re-run serves it instead of buying it again
            return f"ledger_error: settle not recorded ({_scrub(str(e), self.api_key, 160)})"
        return None

    async def cache_answer(self, record: dict[str, Any], *, ledger_failed: bool) -> str | None:
        try:
            await asyncio.to_thread(self.cache.put, self.cid, record)
        except OSError as e:
            lost = "(answer lost: a re-run buys it again)" if ledger_failed else "(answer kept in the ledger)"
            return f"cache_error: {e.strerror or type(e).__name__} writing {self.cache.dir} {lost}"
        return None


async def call_teacher(
    http: httpx.AsyncClient,
    teacher: TeacherConfig,
    api_key: str | None,
    body: dict[str, Any],
    cid: str,
    *,
    ledger: AsyncLedger,
    cache: ResponseCache,
    run_id: str,
    ceiling_usd: float,
    semaphore: asyncio.Semaphore,
    guard: TeacherGuard | None = None,
    cache_key: str | None = None,
    cache_hint: anthropic.CacheHint | None = None,
) -> CallResult:
    """Send one request (with retries) under the money rules; always returns a result.

    The caller holds the ledger claim on ``cid``. A paid answer is stored in the ledger (with its
    settle, one transaction) before the cache file is written; a cache that cannot be written costs
    nothing but the note ``cache_error`` on the row (the next run finds the answer in the ledger)."""
    est, worst = worst_case_usd(body, teacher)
    call = _Call(
        http,
        teacher,
        api_key,
        cid,
        ledger,
        cache,
        run_id,
        ceiling_usd,
        guard or TeacherGuard(),
        wire_body(teacher, body, cache_key, cache_hint),
        est,
        max_completion_tokens(body, teacher),
        worst,
    )
    n = adapted = 0
    async with semaphore:
        while True:
            n += 1
            got = await call.attempt(n)
            if isinstance(got, CallResult):
                return got
            # tried again at once without the parameter the model refused
            if got.adapted:
                adapted += 1
                continue
            if not got.retry or n > teacher.max_retries + adapted:
                break
            await asyncio.sleep(backoff_delay(teacher, n - adapted, _retry_after(got.headers) if got.headers else None))
    out = call.out
    out.status = "failed"
    out.reason = call.last_reason if out.attempts <= 1 else f"{call.last_reason} (after {out.attempts} attempts)"
    return out
