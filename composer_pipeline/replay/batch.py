"""Batch mode (``mode: batch``, ``replay --mode batch``): nightly backfills through the providers' batch APIs.

In:  the prepared :class:`~composer_pipeline.replay.requests.ReplayRequest` list of a replay run, its
     :class:`TeachersConfig`, API keys, the response cache and the ledger; ``wait`` (False: ``--no-wait``).
Out: a :class:`~composer_pipeline.replay.run.ReplayResult` (schema ``teacher_replays``), with one row per
     request: answered from the cache or the ledger, answered from a batch's result file, ``budget_exhausted``,
     or ``failed`` with ``batch_pending: ...`` while its batch runs (a later run with the same arguments collects).

One pass (:func:`replay_batch`):

1. answers already bought (response cache, then the ledger's claims) are served, as in sync mode;
2. **recover**: every live batch of these teachers in the ledger whose POST was never answered (state
   ``recorded``: the process died or the connection dropped between the ledger record and the provider's
   answer) is looked for at the provider: OpenAI by the batch's ``metadata.cp_batch`` (our batch id);
   Anthropic (its batches carry no metadata) by an unknown batch created since the record with the same
   number of requests. Found: its id is recorded and it is collected like any other. Provably absent (the
   provider's list reaches back past the record time and holds none): the same calls go out again under the
   same ledger batch and reservations;
3. **submit**: each teacher's outstanding calls that no live batch holds go out as provider batches (at most
   :data:`LIMITS` requests and bytes each), ``custom_id`` = the call id. The ledger records the batch, its
   calls and their reservations at batch prices BEFORE the POST (``ledger/batches.py``), the provider's id
   right after its answer;
4. **collect**: each live batch that has ended is read once; each ``custom_id`` still pending is settled from
   the result at the billed usage × ``batch_price_factor`` through ``pricing.settle`` (clamped within its
   reservation, as in sync mode), stored in the ledger (claim) and the cache; expired, canceled and errored
   requests are released (not billed) and go out again alone in a new batch (never the whole batch), at most
   :data:`MAX_SUBMISSIONS` times;
5. with ``wait`` the pass sleeps ``poll_batches_s`` and collects again until none of its calls is pending.

In Dagster a pass never waits (``assets/replay.py``); :func:`batches_ended` is what ``batch_collect_sensor``
asks before it requests the run that collects.

Deliberately simplified: synchronous HTTP (one request at a time: a batch pass makes a handful); a sync run
over a call that a live batch holds does not wait for the batch (run batch mode again to collect it);
parameters a model refuses are not learned in batch mode (the request is errored and retried as is, up to
:data:`MAX_SUBMISSIONS`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import orjson
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.ledger import Ledger
from composer_pipeline.ledger.batches import (
    BatchCall,
    BatchRow,
    PendingCall,
    call_states,
    finish_call,
    known_provider_ids,
    live_batches,
    pending_calls,
    record_batch,
    recorded_by_live_run,
    set_collected,
    set_requests,
    set_submitted,
)
from composer_pipeline.replay.call import (
    CallResult,
    _read_answer,
    _scrub,
    answer_from_response,
    answer_record,
    stream_cache_key,
    wire_body,
)
from composer_pipeline.replay.plan import _cache_get
from composer_pipeline.replay.report import replay_summary
from composer_pipeline.replay.requests import ReplayRequest, with_cache_hints
from composer_pipeline.replay.run import ReplayResult, _from_cache, _row
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import TeacherConfig, TeachersConfig, clean_api_keys
from composer_pipeline.teachers.pricing import max_completion_tokens, settle, worst_case_usd

log = logging.getLogger(__name__)

# per provider batch: (requests, bytes) — OpenAI: 50,000 requests and 200 MB per input file; Anthropic: 100,000
# requests or 256 MB per batch (providers.md "Batch APIs"); the bytes kept 1% under, for the envelope
LIMITS: dict[str, tuple[int, int]] = {"openai": (50_000, 198_000_000), "anthropic": (100_000, 253_000_000)}
# a call errored, expired or canceled this many times fails with the last reason
MAX_SUBMISSIONS = 3
# provider and ledger clocks: a batch created this long before our record still matches
RECOVERY_SLACK_S = 600.0


def batch_priced(t: TeacherConfig) -> TeacherConfig:
    """``t`` at its batch prices (``batch_price_factor`` of every price): what reservations and settles use."""
    f = t.batch_price_factor

    def scaled(v: float | None) -> float | None:
        return None if v is None else v * f

    return dataclasses.replace(
        t,
        input_usd_per_mtok=t.input_usd_per_mtok * f,
        output_usd_per_mtok=t.output_usd_per_mtok * f,
        cached_input_usd_per_mtok=scaled(t.cached_input_usd_per_mtok),
        cache_write_usd_per_mtok=scaled(t.cache_write_usd_per_mtok),
    )


def priced_for_batch(requests: list[ReplayRequest]) -> list[ReplayRequest]:
    """``requests`` with their teachers at batch prices (worst case and prediction): what a batch-mode cost plan
    prices. The call ids stay: an answer is the same whichever way it was bought."""
    teachers: dict[str, TeacherConfig] = {}
    out = []
    for r in requests:
        bt = teachers.get(r.teacher.name) or teachers.setdefault(r.teacher.name, batch_priced(r.teacher))
        worst = 0.0 if r.skip_reason else r.worst_case_usd * r.teacher.batch_price_factor
        out.append(dataclasses.replace(r, teacher=bt, worst_case_usd=worst))
    return out


class BatchUnknown(RuntimeError):
    """The provider may or may not have the batch (no answer, 5xx): left recorded, looked for on the next pass."""


@dataclass
class Outcome:
    # succeeded | errored | expired | canceled
    kind: str
    data: dict[str, Any] | None = None  # the answer body (succeeded)
    reason: str = ""


class BatchClient:
    """One teacher's batch endpoint: OpenAI Files + Batches, or Anthropic Message Batches."""

    def __init__(self, teacher: TeacherConfig, api_key: str | None):
        self.t, self.key = teacher, api_key
        auth = httpx.BasicAuth(*teacher.basic_auth) if teacher.basic_auth else None
        self.http = httpx.Client(timeout=teacher.timeout_s, trust_env=False, follow_redirects=False, auth=auth)
        base = teacher.base_url.rstrip("/")
        if teacher.api == "anthropic":
            self.root = base + ("/messages/batches" if base.endswith("/v1") else "/v1/messages/batches")
        else:
            self.root = base + "/batches"
        self.base = base

    def close(self) -> None:
        self.http.close()

    def headers(self) -> dict[str, str]:
        if self.t.api == "anthropic":
            h = {"anthropic-version": self.t.anthropic_version}
            if self.key:
                h["x-api-key"] = self.key
            return h
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def _call(self, method: str, url: str, extra: dict[str, str] | None = None, **kw) -> httpx.Response:
        try:
            resp = self.http.request(method, url, headers={**self.headers(), **(extra or {})}, **kw)
        except httpx.HTTPError as e:
            raise BatchUnknown(f"{type(e).__name__}: {_scrub(str(e), self.key, 160)}") from None
        if resp.status_code >= 500 or resp.status_code in (408, 429):
            raise BatchUnknown(f"HTTP {resp.status_code}: {_scrub(resp.text, self.key, 160)}")
        return resp

    def line(self, cid: str, wire: dict[str, Any]) -> bytes:
        if self.t.api == "anthropic":
            return orjson.dumps({"custom_id": cid, "params": wire})
        return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": wire})

    def create(self, batch_id: str, lines: list[bytes]) -> tuple[str | None, str]:
        """(the provider's batch id, "") or (None, why it was refused: certainly not created). Raises
        :class:`BatchUnknown` when the answer is lost."""
        if self.t.api == "anthropic":
            resp = self._post_json(self.root, b'{"requests":[' + b",".join(lines) + b"]}")
        else:
            up = self._call(
                "POST",
                self.base + "/files",
                data={"purpose": "batch"},
                files={"file": (f"{batch_id}.jsonl", b"\n".join(lines) + b"\n", "application/jsonl")},
            )
            if up.status_code != 200:
                return None, f"file upload refused: HTTP {up.status_code}: {_scrub(up.text, self.key, 200)}"
            fid = up.json()["id"]
            req = {
                "input_file_id": fid,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": {"cp_batch": batch_id},
            }
            resp = self._post_json(self.root, orjson.dumps(req))
        if resp.status_code != 200:
            return None, f"batch refused: HTTP {resp.status_code}: {_scrub(resp.text, self.key, 200)}"
        return str(resp.json()["id"]), ""

    def _post_json(self, url: str, body: bytes) -> httpx.Response:
        return self._call("POST", url, content=body, extra={"Content-Type": "application/json"})

    def get(self, provider_id: str) -> dict[str, Any]:
        resp = self._call("GET", f"{self.root}/{provider_id}")
        if resp.status_code != 200:
            raise BatchUnknown(f"GET batch {provider_id}: HTTP {resp.status_code}")
        return resp.json()

    def ended(self, obj: dict[str, Any]) -> bool:
        if self.t.api == "anthropic":
            return obj.get("processing_status") == "ended"
        return obj.get("status") in ("completed", "expired", "failed", "cancelled")

    def results(self, obj: dict[str, Any]) -> dict[str, Outcome]:
        """custom_id -> what became of it (a request missing from the results is not here)."""
        out: dict[str, Outcome] = {}
        if self.t.api == "anthropic":
            for rec in self._jsonl(obj.get("results_url") or f"{self.root}/{obj['id']}/results"):
                res = rec.get("result") or {}
                kind = str(res.get("type"))
                if kind == "succeeded":
                    out[str(rec["custom_id"])] = Outcome(kind, res.get("message"))
                else:
                    err = (res.get("error") or {}).get("error") or res.get("error") or {}
                    out[str(rec["custom_id"])] = Outcome(kind, None, str(err.get("message") or kind)[:200])
            return out
        for key in ("output_file_id", "error_file_id"):
            if obj.get(key):
                for rec in self._jsonl(f"{self.base}/files/{obj[key]}/content"):
                    cid, resp, err = str(rec["custom_id"]), rec.get("response") or {}, rec.get("error") or {}
                    if resp.get("status_code") == 200:
                        out[cid] = Outcome("succeeded", resp.get("body"))
                    elif err.get("code") == "batch_expired":
                        out[cid] = Outcome("expired", None, str(err.get("message") or "batch_expired")[:200])
                    else:
                        body = resp.get("body") or {}
                        msg = (body.get("error") or {}).get("message") or err.get("message") or "errored"
                        out[cid] = Outcome("errored", None, f"HTTP {resp.get('status_code')}: {msg}"[:200])
        return out

    def _jsonl(self, url: str) -> list[dict[str, Any]]:
        resp = self._call("GET", url)
        if resp.status_code != 200:
            raise BatchUnknown(f"GET {url}: HTTP {resp.status_code}")
        return [orjson.loads(ln) for ln in resp.content.splitlines() if ln.strip()]

    def find(self, row: BatchRow, known: set[str], call_ids: set[str]) -> str | None:
        """The provider's id of the batch ``row`` recorded (holding ``call_ids``) whose POST went unanswered;
        None when the provider provably has none (its list reaches back past the record time). Raises
        :class:`BatchUnknown` while that cannot be told yet."""
        resp = self._call("GET", self.root, params={"limit": 100})
        if resp.status_code != 200:
            raise BatchUnknown(f"list batches: HTTP {resp.status_code}")
        page = resp.json()
        items = page.get("data") or []
        since = row.created_at - RECOVERY_SLACK_S
        if self.t.api == "openai":
            for b in items:
                if (b.get("metadata") or {}).get("cp_batch") == row.id:
                    return str(b["id"])
        # no metadata on Message Batches: an unknown batch since the record, with as many requests
        else:
            cands = [
                b
                for b in items
                if b.get("id") not in known
                and _epoch(b.get("created_at")) >= since
                and sum(int(v) for v in (b.get("request_counts") or {}).values()) == row.n_requests
            ]
            # its custom ids are checked when it is collected (a stranger's are released)
            if len(cands) == 1:
                return str(cands[0]["id"])
            # several alike: the one whose results hold exactly these calls, once they end
            for b in cands:
                if self.ended(b) and set(self.results(b)) == call_ids:
                    return str(b["id"])
            if any(not self.ended(b) for b in cands):
                raise BatchUnknown(f"{len(cands)} unknown batches of {row.n_requests} requests; matched once they end")
        oldest = min((_epoch(b.get("created_at")) for b in items), default=float("inf"))
        if page.get("has_more") and oldest >= since:
            raise BatchUnknown("the provider's list of batches does not reach back to the record; looked again later")
        return None


def _epoch(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


@dataclass
class _Pass:
    """One batch pass over a run's requests (module docstring, steps 2-5)."""

    config: TeachersConfig
    ledger: Ledger
    cache: ResponseCache
    run_id: str
    # call id -> its request (outstanding calls of this run)
    wanted: dict[str, ReplayRequest]
    clients: dict[str, BatchClient]
    results: dict[str, CallResult] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "batches_submitted": 0,
            "batches_recovered": 0,
            "batches_collected": 0,
            "calls_resubmitted": 0,
        }
    )

    # -- submission
    def wire(self, r: ReplayRequest) -> dict[str, Any]:
        return wire_body(r.teacher, r.body, stream_cache_key(r.stream_id), r.cache_hint)

    def submit(self, teacher: TeacherConfig, reqs: list[ReplayRequest]) -> None:
        """``reqs`` out as batches of at most :data:`LIMITS`: each recorded with its reservations first."""
        client = self.clients[teacher.name]
        max_n, max_bytes = LIMITS[teacher.api]
        chunk: list[tuple[ReplayRequest, bytes]] = []
        size = 0
        for r in reqs:
            line = client.line(r.call_id, self.wire(r))
            if chunk and (len(chunk) >= max_n or size + len(line) + 1 > max_bytes):
                self._submit_one(teacher, chunk)
                chunk, size = [], 0
            chunk.append((r, line))
            size += len(line) + 1
        if chunk:
            self._submit_one(teacher, chunk)

    def _submit_one(self, teacher: TeacherConfig, chunk: list[tuple[ReplayRequest, bytes]]) -> None:
        bt = batch_priced(teacher)
        calls = []
        for r, _ in chunk:
            est, worst = worst_case_usd(r.body, bt)
            calls.append(BatchCall(r.call_id, worst, est, max_completion_tokens(r.body, bt)))
        rec = record_batch(
            self.ledger,
            teacher.name,
            teacher.api,
            self.run_id,
            calls,
            budget_usd=teacher.budget_usd,
            ceiling_usd=self.config.ceiling_usd,
        )
        for cid, why in rec.refused.items():
            self.results[cid] = CallResult(status="budget_exhausted", reason=why)
        if rec.batch_id is None:
            return
        granted = set(rec.granted)
        self._send(teacher, rec.batch_id, [line for r, line in chunk if r.call_id in granted], len(granted))

    def _send(self, teacher: TeacherConfig, batch_id: str, lines: list[bytes], n: int) -> None:
        client = self.clients[teacher.name]
        try:
            pid, refused = client.create(batch_id, lines)
        # the provider may have it: left recorded, looked for on the next pass
        except BatchUnknown as e:
            log.warning("batch %s of %s: no answer to its POST (%s); looked for next pass", batch_id, teacher.name, e)
            return
        # certainly not created: its calls released (they may go out again alone)
        if pid is None:
            for call in pending_calls(self.ledger, batch_id).values():
                finish_call(self.ledger, call, "released", note=refused)
                self.results[call.call_id] = CallResult(status="failed", reason=f"batch_refused: {refused}")
            set_collected(self.ledger, batch_id, refused)
            return
        set_submitted(self.ledger, batch_id, pid)
        self.stats["batches_submitted"] += 1
        log.info("teacher %s: batch %s submitted (%s, %d requests)", teacher.name, batch_id, pid, n)

    # -- recovery
    def recover(self, row: BatchRow) -> None:
        client = self.clients[row.teacher]
        if recorded_by_live_run(self.ledger, row.id, self.ledger.owner):
            # its POST may be on the wire now: only its own process, or a run after it died, looks for it
            return
        pend = pending_calls(self.ledger, row.id)
        try:
            pid = client.find(row, known_provider_ids(self.ledger), set(pend))
        except BatchUnknown as e:
            log.warning("batch %s of %s: not found yet (%s)", row.id, row.teacher, e)
            return
        if pid is not None:
            set_submitted(self.ledger, row.id, pid, "found again at the provider after an unanswered POST")
            self.stats["batches_recovered"] += 1
            return
        # provably not at the provider: the same calls go out again under the same record and reservations
        mine = [self.wanted[c] for c in pend if c in self.wanted]
        for cid, call in pend.items():
            # recorded by a run with other arguments: its request is not here
            if cid not in self.wanted:
                finish_call(
                    self.ledger, call, "released", note="batch never reached the provider; not resubmitted here"
                )
        if mine:
            set_requests(self.ledger, row.id, len(mine))  # what a later search for it counts
            t = self.config.teacher(row.teacher)
            self._send(t, row.id, [client.line(r.call_id, self.wire(r)) for r in mine], len(mine))
        else:
            set_collected(self.ledger, row.id, "never reached the provider; nothing to resubmit")

    # -- collection
    def collect(self, row: BatchRow) -> list[str]:
        """Read ``row``'s batch; when it has ended, settle or release each pending call once. The call ids
        released (to go out again alone)."""
        client = self.clients[row.teacher]
        try:
            obj = client.get(str(row.provider_id))
            if not client.ended(obj):
                return []
            outcomes = client.results(obj)
        except BatchUnknown as e:
            log.warning("batch %s (%s) of %s: %s", row.id, row.provider_id, row.teacher, e)
            return []
        t = self.config.teacher(row.teacher)
        released = []
        for cid, call in pending_calls(self.ledger, row.id).items():
            got = outcomes.get(cid) or Outcome("missing", None, "not in the batch's results")
            if got.kind == "succeeded" and got.data is not None:
                self._settle(t, call, got.data)
            else:
                finish_call(self.ledger, call, "released", note=f"batch_{got.kind}: {got.reason}"[:300])
                released.append(cid)
                self.results[cid] = CallResult(status="failed", reason=f"batch_{got.kind}: {got.reason}")
        set_collected(self.ledger, row.id, f"ended: {len(outcomes)} results")
        self.stats["batches_collected"] += 1
        return released

    def _settle(self, t: TeacherConfig, call: PendingCall, raw: dict[str, Any]) -> None:
        bt = batch_priced(t)
        key = self.clients[t.name].key
        data = _read_answer(orjson.dumps(raw), t, key)
        # billed, but no answer: kept at its worst case
        if isinstance(data, str):
            problem = data
            finish_call(self.ledger, call, "kept", note=problem[:300])
            self.results[call.call_id] = CallResult(
                status="failed", reason=problem, cost_usd=call.reserved_usd, reserved_usd=call.reserved_usd, attempts=1
            )
            return
        s = settle(
            data.get("usage"),
            bt,
            prompt_bound=call.prompt_bound,
            completion_bound=call.completion_bound,
            reserved_usd=call.reserved_usd,
        )
        stored, record = answer_record(t, data, s, latency_s=None, attempts=call.submissions, run_id=self.run_id)
        record["batch"] = True
        state = "settled" if s.billed is not None else "kept"
        finish_call(
            self.ledger,
            call,
            state,
            cost_usd=s.cost_usd,
            note=(s.flag or "batch")[:300],
            answer=(call.call_id, record),
            usage=s.billed.as_dict() if s.billed is not None else None,
            run_id=self.run_id,
        )
        try:
            self.cache.put(call.call_id, record)
        except OSError:
            # the answer is in the ledger: a re-run serves it from there
            pass
        res = answer_from_response(stored, t)
        res.cost_usd, res.reserved_usd, res.attempts = s.cost_usd, call.reserved_usd, call.submissions
        if s.flag:
            res.reason = "; ".join(x for x in (res.reason, s.flag) if x)
        self.results[call.call_id] = res


def _served(requests: list[ReplayRequest], cache: ResponseCache, ledger: Ledger) -> dict[str, CallResult]:
    """Answers already bought: from the response cache, else from the ledger (the cache repaired)."""
    out: dict[str, CallResult] = {}
    for r in requests:
        rec = _cache_get(cache, r.call_id)
        if rec is not None:
            out[r.call_id] = _from_cache(rec, r.teacher)
    rest = sorted({r.call_id for r in requests} - set(out))
    answered = ledger.answered_ids(rest)
    for r in requests:
        if r.call_id in answered and r.call_id not in out:
            rec = ledger.answer(r.call_id)
            if rec is not None:
                try:
                    cache.put(r.call_id, rec)
                except OSError:
                    pass
                out[r.call_id] = _from_cache(rec, r.teacher)
    return out


def replay_batch(
    requests: list[ReplayRequest],
    config: TeachersConfig,
    api_keys: dict[str, str | None],
    *,
    cache: ResponseCache,
    ledger: Ledger,
    run_id: str,
    wait: bool = True,
    extra_failed: Iterable[tuple[str, str | None, str]] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayResult:
    """One batch pass over ``requests`` (module docstring); the ``teacher_replays`` table and its summary,
    with the pass's batch counts under ``summary["batch"]``."""
    requests = with_cache_hints(requests)
    api_keys = clean_api_keys(config, api_keys)
    ledger.check_identities(config.identities())
    sent = [r for r in requests if r.skip_reason is None]
    served = _served(sent, cache, ledger)
    wanted: dict[str, ReplayRequest] = {}
    for r in sent:
        if r.call_id not in served:
            wanted.setdefault(r.call_id, r)
    missing_key = {t.name for t in config.teachers if t.api_key_env and not api_keys.get(t.name)}
    clients = {t.name: BatchClient(t, api_keys.get(t.name)) for t in config.teachers if t.name not in missing_key}
    p = _Pass(config, ledger, cache, run_id, wanted, clients)
    for cid, r in wanted.items():
        if r.teacher.name in missing_key:
            p.results[cid] = CallResult(
                status="failed", reason=f"missing_api_key: environment variable {r.teacher.api_key_env} is not set"
            )
    # a live run: no other process looks for its unanswered batches
    ledger.start_run(run_id, config.lease_s)
    try:
        _run_pass(p, wait, sleep)
    finally:
        for c in clients.values():
            c.close()
        ledger.close_run(run_id, "batch pass ended")
    states = call_states(ledger, [c for c in wanted if c not in p.results])
    live_ids, held_usd = _held(ledger, states)
    rows = []
    for r in requests:
        if r.skip_reason is not None:
            res = CallResult(status="failed", reason=r.skip_reason)
        elif r.call_id in served:
            res = served[r.call_id]
        else:
            res = p.results.get(r.call_id) or _pending(states.get(r.call_id))
        rows.append(_row(r, res))
    for sid, skey, reason in extra_failed:
        for t in config.teachers:
            stub = ReplayRequest(sid, skey, t, {}, "", 0, 0.0)
            rows.append(_row(stub, CallResult(status="failed", reason=reason)) | {"call_id": None})
    table = tables.conform(pa.Table.from_pylist(rows, schema=tables.TEACHER_REPLAYS), "teacher_replays")
    summary = replay_summary(table)
    summary["batch"] = {
        **p.stats,
        "calls_pending": sum(1 for r in rows if (r["reason"] or "").startswith("batch_pending")),
        # the batches this run's pending calls wait in
        "live_batch_ids": live_ids,
        # what those calls hold in the ledger (their worst case at batch prices)
        "held_usd": held_usd,
    }
    return ReplayResult(table, summary)


def _held(ledger: Ledger, states: dict[str, tuple[str, str, int, str | None]]) -> tuple[list[str], float]:
    """(the live batches holding the pending calls among ``states``, the USD those calls hold)."""
    by_batch: dict[str, set[str]] = {}
    for cid, st in states.items():
        if st[0] == "pending":
            by_batch.setdefault(st[1], set()).add(cid)
    held = 0.0
    for bid, cids in by_batch.items():
        held += sum(c.reserved_usd for cid, c in pending_calls(ledger, bid).items() if cid in cids)
    return sorted(by_batch), held


def batches_ended(config: TeachersConfig, api_keys: Mapping[str, str | None], rows: list[BatchRow]) -> dict[str, str]:
    """batch id -> ``"ended"``, ``"running"`` or why it cannot be told now, for each of ``rows``: asked of the
    provider through :class:`BatchClient` (what a pass's collect step reads), nothing settled. A batch
    already collected has ended; one whose POST went unanswered (``recorded``) needs a pass to look for it,
    so it counts as ended. What the Dagster ``batch_collect_sensor`` asks before it requests a collecting run."""
    keys = clean_api_keys(config, api_keys)
    names = {t.name for t in config.teachers}
    out: dict[str, str] = {}
    clients: dict[str, BatchClient] = {}
    try:
        for row in rows:
            if row.state == "collected" or row.state == "recorded":
                out[row.id] = "ended"
                continue
            if row.teacher not in names:
                out[row.id] = f"teacher {row.teacher} is not in the teachers recipe"
                continue
            t = config.teacher(row.teacher)
            if t.api_key_env and not keys.get(t.name):
                out[row.id] = f"missing_api_key: environment variable {t.api_key_env} is not set"
                continue
            client = clients.get(t.name) or clients.setdefault(t.name, BatchClient(t, keys.get(t.name)))
            try:
                out[row.id] = "ended" if client.ended(client.get(str(row.provider_id))) else "running"
            except BatchUnknown as e:
                out[row.id] = f"not told by the provider: {e}"
    finally:
        for c in clients.values():
            c.close()
    return out


def _pending(state: tuple[str, str, int, str | None] | None) -> CallResult:
    if state is None:
        return CallResult(status="failed", reason="batch_pending: not submitted yet (its batch POST is unanswered)")
    return CallResult(
        status="failed",
        reason=f"batch_pending: in batch {state[1]} ({state[0]}); a later run with the same arguments collects it",
    )


def _run_pass(p: _Pass, wait: bool, sleep: Callable[[float], None]) -> None:
    names = [n for n in p.clients]
    for row in live_batches(p.ledger, names):
        if row.state == "recorded":
            p.recover(row)
    held = {cid for cid, st in call_states(p.ledger, list(p.wanted)).items() if st[0] == "pending"}
    by_teacher: dict[str, list[ReplayRequest]] = {}
    for cid, r in p.wanted.items():
        if cid not in held and cid not in p.results:
            by_teacher.setdefault(r.teacher.name, []).append(r)
    for name, reqs in by_teacher.items():
        if name in p.clients:
            p.submit(p.config.teacher(name), reqs)
    while True:
        again: dict[str, list[ReplayRequest]] = {}
        for row in live_batches(p.ledger, names):
            if row.state == "recorded":
                p.recover(row)
                continue
            for cid in p.collect(row):
                released = p.wanted.get(cid)
                st = call_states(p.ledger, [cid]).get(cid)
                if released is not None and st is not None and st[2] < MAX_SUBMISSIONS:
                    del p.results[cid]
                    again.setdefault(released.teacher.name, []).append(released)
        # only the released calls, alone in a new batch
        for name, reqs in again.items():
            p.stats["calls_resubmitted"] += len(reqs)
            p.submit(p.config.teacher(name), reqs)
        if not wait or not _ours_pending(p):
            return
        _sleep_alive(p, sleep)


def _sleep_alive(p: _Pass, sleep: Callable[[float], None]) -> None:
    """Wait ``poll_batches_s``, heartbeating the run's lease at least every third of it."""
    left = p.config.poll_batches_s
    while left > 0:
        step = min(left, p.config.lease_s / 3)
        p.ledger.heartbeat(p.run_id)
        sleep(step)
        left -= step
    p.ledger.heartbeat(p.run_id)


def _ours_pending(p: _Pass) -> bool:
    states = call_states(p.ledger, [c for c in p.wanted if c not in p.results])
    return any(st[0] == "pending" for st in states.values()) or any(
        c not in states for c in p.wanted if c not in p.results
    )
