"""One teacher call over HTTP with retries, money reservations and the response cache.

In:  a :class:`TeacherConfig`, its API key (a value; may be ``None`` for local servers), the request
     body and its ``call_id``, an ``httpx.AsyncClient`` per teacher, a semaphore, the ledger, the cache.
Out: a :class:`CallResult`: answered (with the parsed action or the raw answer and the parse error),
     failed (with a reason) or budget_exhausted. It never raises for a teacher's misbehaviour.

Per attempt: reserve the worst case (refused → ``budget_exhausted``, nothing sent), POST, then

* 200 + JSON with usage → settle at reported usage × prices, write the cache, parse the answer;
* 200 + JSON without usable usage → keep the reservation (worst case counted), still an answer;
* 429 / 408 / 5xx error response → release, back off (``Retry-After`` honoured), retry;
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

Retries are bounded by ``max_retries``; backoff is exponential with full jitter
(``uniform(0, min(backoff_max_s, backoff_s · 2^n))``, the AWS "full jitter" scheme).

The key is only ever placed in the ``Authorization`` header; the whole response and any reason text
derived from a response or an exception have it removed (as written, JSON-, URL- and repr-escaped:
``redact.py``) before anything is cached, stored or logged. A teacher's answer (and any error text) also goes
through the ingest secret scrubber before it is cached, stored or logged: a teacher that echoes or
invents a key does not put it on disk.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import orjson

from composer_pipeline.actions import Action, ActionParseError, parse_chat_message
from composer_pipeline.scrub import scrub_obj
from composer_pipeline.teachers import anthropic
from composer_pipeline.teachers.cache import ResponseCache, canonical_json
from composer_pipeline.teachers.config import TeacherConfig
from composer_pipeline.teachers.ledger import AsyncLedger, LedgerError, Reserve
from composer_pipeline.teachers.pricing import billed, usage_cost, worst_case_usd
from composer_pipeline.teachers.redact import redact_key, redact_text

# a provider's answer that the prompt is longer than its window (HTTP 400, not billed): OpenAI-style
# ``context_length_exceeded``, Anthropic ``prompt is too long``; replay refits once, then skips the state
CONTEXT_EXCEEDED_RE = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|context window", re.I
)

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
    cached_tokens: int | None = None  # prompt tokens the provider billed as cache reads
    cache_write_tokens: int | None = None  # prompt tokens it billed as cache writes (Anthropic)
    elided_messages: int = 0  # messages the fitted prefix replaced by its marker (render.fit_messages)
    cut_messages: int = 0  # messages whose content was cut in the middle to fit


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
    window = limit + 4096 + 8 * len(api_key or "")  # (a key starting before ``limit`` ends inside it)
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
    """Turn a cached or fresh chat-completions JSON into an answered result (parse errors kept)."""
    message = data["choices"][0]["message"]
    p, c, cost = usage_cost(data.get("usage"), teacher)
    res = CallResult(status="answered", raw_answer=raw_answer_of(message), prompt_tokens=p, completion_tokens=c)
    b = billed(data.get("usage"), teacher)
    if b is not None:
        res.cached_tokens, res.cache_write_tokens = b.cached_tokens, b.cache_write_tokens
    try:
        action = parse_chat_message(message)
    except ActionParseError as e:
        res.reason = f"unparseable: {e}"
        return res
    res.action = action
    if action.is_empty:
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
    import hashlib

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
    if cache_key and teacher.prompt_cache_key:
        return {**body, "prompt_cache_key": cache_key}
    return body


def _host(teacher: TeacherConfig) -> str:
    u = httpx.URL(teacher.base_url)
    return f"{u.host}:{u.port}" if u.port else str(u.host)


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
    _, worst = worst_case_usd(body, teacher)
    payload = canonical_json(wire_body(teacher, body, cache_key, cache_hint))
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if teacher.api == "anthropic":
        headers["anthropic-version"] = teacher.anthropic_version
        if api_key:
            headers["x-api-key"] = api_key
    elif api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    guard = guard or TeacherGuard()
    out = CallResult(status="failed")
    last_reason = ""
    async with semaphore:
        for attempt in range(1, teacher.max_retries + 2):
            if guard.disabled_reason:
                out.status, out.reason = "failed", guard.disabled_reason
                return out
            res = await ledger.reserve(Reserve(teacher.name, teacher.budget_usd, run_id, ceiling_usd, worst, cid))
            if not res.ok:
                out.status = "budget_exhausted"
                out.reason = f"budget_exhausted: {res.reason}" + (
                    f" (after attempt {attempt - 1}: {last_reason})" if last_reason else ""
                )
                return out
            if guard.disabled_reason:  # another call cut the teacher off while this one waited for money
                await ledger.close(res.id, "released", note=guard.disabled_reason[:200])
                out.status, out.reason = "failed", guard.disabled_reason
                return out
            out.reserved_usd += worst
            out.attempts = attempt
            await ledger.mark_sent(res.id)
            t0 = time.perf_counter()
            retry_after: float | None = None
            status_code: int | None = None
            outcome = "keep"  # what happens to this attempt's reservation: keep | release
            retry = False
            try:
                async with http.stream("POST", teacher.request_url, content=payload, headers=headers) as resp:
                    status_code = resp.status_code
                    raw = await resp.aread()
            except (httpx.LocalProtocolError, UnicodeEncodeError) as e:
                # the request could not be formed (e.g. a header value HTTP forbids): nothing left this process
                outcome = "release"
                last_reason = (
                    f"request_refused: {type(e).__name__} building the request to {_host(teacher)} (nothing was sent)"
                )
            except httpx.ConnectError as e:
                outcome, retry = "release", True
                last_reason = f"connection_error: {type(e).__name__} connecting to {_host(teacher)}"
            except httpx.ConnectTimeout:
                outcome, retry = "release", True
                last_reason = f"connection_error: ConnectTimeout connecting to {_host(teacher)}"
            except httpx.TimeoutException as e:
                retry = True
                last_reason = f"timeout: {type(e).__name__} after {teacher.timeout_s:g}s from {_host(teacher)}"
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                retry = True
                kind = "truncated_body" if status_code is not None else "connection_dropped"
                last_reason = f"{kind}: {type(e).__name__} from {_host(teacher)}: {_scrub(str(e), api_key, 120)}"
            except httpx.HTTPError as e:  # protocol/decoding/proxy problems: sent, outcome unknown, not retried
                last_reason = f"http_error: {type(e).__name__} from {_host(teacher)}: {_scrub(str(e), api_key, 120)}"
            else:
                latency = time.perf_counter() - t0
                if status_code == 200:
                    try:
                        data = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        data = None
                        head = _scrub(raw.decode("utf-8", "replace"), api_key, 60)
                        problem = f"invalid_json: {len(raw)} bytes that do not parse as JSON ({head!r}...)"
                    else:
                        # before the cache, the ledger, the table and any log see it
                        data = await asyncio.to_thread(_clean_answer, data, api_key)
                        problem = anthropic.message_problem(data) if teacher.api == "anthropic" else None
                        if (
                            teacher.api == "anthropic" and problem is None
                        ):  # the native answer, mapped to the one shape stored
                            data = anthropic.to_chat_completion(data)
                        problem = problem or _valid_completion(data)
                        problem = f"bad_response: {_scrub(problem, api_key)}" if problem else None
                    if problem:
                        await ledger.close(res.id, "kept", note=problem[:200])
                        out.cost_usd += worst
                        guard.invalid(problem)
                        out.status, out.reason = "failed", problem
                        return out
                    guard.valid()
                    p, c, cost = usage_cost(data.get("usage"), teacher)
                    bill = billed(data.get("usage"), teacher)
                    record = {
                        "teacher": teacher.name,
                        "model": teacher.model,
                        "base_url": teacher.base_url.rstrip("/"),
                        "response": data,
                        "cost_usd": worst if cost is None else cost,
                        "latency_s": latency,
                        "attempts": attempt,
                        "run_id": run_id,
                        "received_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    }
                    # the answer is durable in the ledger (same transaction as its settle) before anything else
                    ledger_note = None
                    try:
                        if cost is None:
                            await ledger.close(res.id, "kept", note="no usable usage in response", answer=(cid, record))
                        else:
                            await ledger.close(
                                res.id,
                                "settled",
                                cost_usd=cost,
                                answer=(cid, record),
                                usage=bill.as_dict() if bill is not None else None,
                            )
                    except LedgerError as e:
                        # paid, but the ledger could not record it (full disk, server gone past its outage limit): the
                        # reservation stays open (sent: kept at worst case when the run is finalized) and the answer
                        # goes to the cache, so a re-run serves it instead of buying it again
                        ledger_note = f"ledger_error: settle not recorded ({_scrub(str(e), api_key, 160)})"
                    cost = worst if cost is None else cost
                    cache_note = None
                    try:
                        await asyncio.to_thread(cache.put, cid, record)
                    except OSError as e:
                        cache_note = f"cache_error: {e.strerror or type(e).__name__} writing {cache.dir} " + (
                            "(answer lost: a re-run buys it again)" if ledger_note else "(answer kept in the ledger)"
                        )
                    cache_note = "; ".join(n for n in (ledger_note, cache_note) if n) or None
                    ans = answer_from_response(data, teacher)
                    ans.cost_usd = out.cost_usd + cost
                    ans.reserved_usd = out.reserved_usd
                    ans.attempts = attempt
                    ans.latency_s = latency
                    if p is None and ans.reason is None:
                        ans.reason = "no_usage: worst case charged"
                    if cache_note:
                        ans.reason = f"{ans.reason}; {cache_note}" if ans.reason else cache_note
                    return ans
                outcome = "release"
                text = _scrub(raw.decode("utf-8", "replace"), api_key, 200)
                last_reason = f"http_{status_code}: {text}"
                if status_code == 400 and CONTEXT_EXCEEDED_RE.search(raw.decode("utf-8", "replace")[:2000]):
                    last_reason = f"context_length_exceeded: {text}"  # not billed: released below, refit by replay
                if status_code in RETRY_STATUS or (status_code or 0) >= 500:
                    retry = True
                    retry_after = _retry_after(resp.headers)
            # an attempt that did not produce an answer
            if outcome == "release":
                await ledger.close(res.id, "released", note=last_reason[:200])
            else:
                await ledger.close(res.id, "kept", note=last_reason[:200])
                out.cost_usd += worst
            if not retry or attempt > teacher.max_retries:
                break
            await asyncio.sleep(backoff_delay(teacher, attempt, retry_after))
    out.status = "failed"
    out.reason = last_reason if out.attempts <= 1 else f"{last_reason} (after {out.attempts} attempts)"
    return out
