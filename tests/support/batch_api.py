"""Both providers' batch APIs on the loopback provider emulator (``provider_emulator.ProviderEmulator``).

In:  OpenAI: ``POST /v1/files`` (multipart, ``purpose=batch``, a JSONL of ``{custom_id, method, url, body}``),
     ``POST /v1/batches {input_file_id, endpoint, completion_window, metadata}``, ``GET /v1/batches[/{id}]``,
     ``GET /v1/files/{id}/content``. Anthropic: ``POST /v1/messages/batches {requests: [{custom_id, params}]}``,
     ``GET /v1/messages/batches[/{id}]``, ``GET /v1/messages/batches/{id}/results``.
Out: batch objects in each provider's shape (providers.md "Batch APIs"); result files once a batch has ended.

Controls on :class:`BatchBook` (``emulator.batches``), all consumed by the tests:

* ``end``: False keeps every batch in progress; True ends each one at its next read (its requests are
  answered then, by the emulator's own rules, and billed at ``rate`` of the emulator's price: ``Bill.batch``);
* ``expire`` / ``error`` / ``cancel``: custom ids that come back expired (OpenAI ``batch_expired`` in the error
  file), errored (a 400) or canceled (Anthropic) the next time a batch holding them ends (consumed: a
  resubmission succeeds); none of them is billed;
* ``hang_creates``: that many batch creations are made (the batch exists at the provider) but never
  answered (the connection is held until ``release`` is set): a client killed while it waits;
* ``fail_creates``: that many creations answer 503 without creating anything;
* ``fail_reads``: that many reads of one batch object answer 503 (a provider outage while a client polls);
* ``max_requests``: a create with more requests is refused (400), as the providers refuse one over their limit.

Deliberately simplified: a batch ends all at once when read after ``end``; no ``validating`` / ``finalizing``
phases, no cancel endpoint, no pagination (one page holds every batch).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import default as email_policy
from typing import Any

import orjson


@dataclass
class EmuBatch:
    id: str
    api: str  # openai | anthropic
    lines: list[tuple[str, dict[str, Any]]]  # (custom_id, request body)
    created_at: float
    heads: dict[str, str]
    metadata: dict[str, str] = field(default_factory=dict)
    input_file_id: str | None = None
    results: list[dict[str, Any]] | None = None  # once ended
    counts: dict[str, int] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    ending: bool = False  # one thread is answering its requests


@dataclass
class BatchBook:
    end: bool = False
    # both providers bill batch requests at 50% (providers.md)
    rate: float = 0.5
    expire: set[str] = field(default_factory=set)
    error: set[str] = field(default_factory=set)
    cancel: set[str] = field(default_factory=set)
    hang_creates: int = 0
    # that many batch creations answer 503 and create nothing
    fail_creates: int = 0
    # that many GETs of one batch object answer 503
    fail_reads: int = 0
    max_requests: int = 100_000
    release: threading.Event = field(default_factory=threading.Event)
    # set once a hung create has made its batch
    hung: threading.Event = field(default_factory=threading.Event)
    files: dict[str, bytes] = field(default_factory=dict)
    batches: dict[str, EmuBatch] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def created(self, api: str | None = None) -> list[EmuBatch]:
        with self.lock:
            return [b for b in self.batches.values() if api is None or b.api == api]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _auth_ok(handler, api: str) -> bool:
    key = handler.server.api_key
    if key is None:
        return True
    if api == "anthropic":
        return handler.headers.get("x-api-key") == key
    return handler.headers.get("Authorization") == f"Bearer {key}"


def batch_post(handler, path: str, raw: bytes) -> bool:
    """Serve a batch-API POST; False when ``path`` is not one."""
    if path == "/v1/files":
        _upload(handler, raw)
    elif path == "/v1/batches":
        _create(handler, "openai", raw)
    elif path == "/v1/messages/batches":
        _create(handler, "anthropic", raw)
    else:
        return False
    return True


def batch_get(handler) -> bool:
    """Serve a batch-API GET; False when the path is not one."""
    path = handler.path.split("?", 1)[0].rstrip("/")
    book: BatchBook = handler.server.batches
    parts = path.split("/")
    if path.startswith("/v1/files/") and path.endswith("/content"):
        data = book.files.get(parts[3])
        if data is None:
            handler._send(404, {"error": {"message": "no such file"}})
        else:
            _send_bytes(handler, data)
        return True
    api = "anthropic" if path.startswith("/v1/messages/batches") else "openai" if path.startswith("/v1/batches") else ""
    if not api:
        return False
    if not _auth_ok(handler, api):
        handler._send(401, {"error": {"type": "authentication_error", "message": "invalid key"}})
        return True
    rest = parts[4:] if api == "anthropic" else parts[3:]
    if not rest:  # list
        with book.lock:
            mine = [b for b in book.batches.values() if b.api == api]
        data = [_view(handler.server, b) for b in sorted(mine, key=lambda b: -b.created_at)]
        handler._send(200, {"object": "list", "data": data, "has_more": False})
        return True
    if rest[1:] == []:
        with book.lock:
            fail = book.fail_reads > 0
            book.fail_reads -= int(fail)
        if fail:
            handler._send(503, {"error": {"type": "api_error", "message": "emulated outage"}})
            return True
    b = book.batches.get(rest[0])
    if b is None or b.api != api:
        handler._send(404, {"error": {"type": "not_found_error", "message": f"no batch {rest[0]}"}})
        return True
    if rest[1:] == ["results"]:
        _end(handler.server, b)
        if b.results is None:
            handler._send(400, {"error": {"message": "batch has not ended"}})
        else:
            _send_bytes(handler, b"".join(orjson.dumps(r) + b"\n" for r in reversed(b.results)))
        return True
    handler._send(200, _view(handler.server, b))
    return True


def _send_bytes(handler, data: bytes) -> None:
    from tests.support.scripted_server import JsonHandler

    JsonHandler._send(handler, 200, data)


def _upload(handler, raw: bytes) -> None:
    srv, book = handler.server, handler.server.batches
    if not _auth_ok(handler, "openai"):
        handler._send(401, {"error": {"message": "invalid key"}})
        return
    msg = BytesParser(policy=email_policy).parsebytes(
        b"Content-Type: " + handler.headers.get("Content-Type", "").encode() + b"\r\n\r\n" + raw
    )
    fields: dict[str, bytes] = {}
    for part in msg.iter_parts() if msg.is_multipart() else []:
        name = part.get_param("name", header="content-disposition")
        fields[str(name)] = part.get_payload(decode=True) or b""
    if fields.get("purpose") != b"batch" or "file" not in fields:
        handler._send(400, {"error": {"message": "purpose=batch and a file are required"}})
        return
    with book.lock:
        fid = f"file-emu{len(book.files)}"
        book.files[fid] = fields["file"]
    del srv
    handler._send(200, {"id": fid, "object": "file", "purpose": "batch", "bytes": len(fields["file"])})


def _bad(handler, msg: str) -> None:
    handler._send(400, {"type": "error", "error": {"type": "invalid_request_error", "message": msg}})


def _create(handler, api: str, raw: bytes) -> None:
    book: BatchBook = handler.server.batches
    if not _auth_ok(handler, api):
        handler._send(401, {"error": {"type": "authentication_error", "message": "invalid key"}})
        return
    with book.lock:
        fail = book.fail_creates > 0
        book.fail_creates -= int(fail)
    if fail:
        handler._send(503, {"error": {"type": "api_error", "message": "emulated outage"}})
        return
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        _bad(handler, "invalid JSON")
        return
    if api == "openai":
        data = book.files.get(str(body.get("input_file_id")))
        if data is None or body.get("endpoint") != "/v1/chat/completions" or body.get("completion_window") != "24h":
            _bad(handler, "input_file_id, endpoint /v1/chat/completions and completion_window 24h are required")
            return
        lines = []
        for ln in data.splitlines():
            if ln.strip():
                req = orjson.loads(ln)
                if req.get("method") != "POST" or req.get("url") != "/v1/chat/completions":
                    _bad(handler, f"line {req.get('custom_id')}: method POST and url /v1/chat/completions required")
                    return
                lines.append((str(req["custom_id"]), req["body"]))
    else:
        if "anthropic-version" not in {k.lower() for k in handler.headers}:
            _bad(handler, "anthropic-version header is required")
            return
        lines = [(str(r["custom_id"]), r["params"]) for r in body.get("requests") or []]
    ids = [c for c, _ in lines]
    if not lines or len(ids) != len(set(ids)):
        _bad(handler, "requests must be non-empty with unique custom_id")
        return
    if len(lines) > book.max_requests:
        _bad(handler, f"at most {book.max_requests} requests per batch, got {len(lines)}")
        return
    heads = {k: handler.headers.get(k, "") for k in ("anthropic-version", "x-api-key")}
    with book.lock:
        bid = f"{'msgbatch' if api == 'anthropic' else 'batch'}_emu{len(book.batches)}"
        b = EmuBatch(bid, api, lines, time.time(), heads, dict(body.get("metadata") or {}), body.get("input_file_id"))
        book.batches[bid] = b
        hang = book.hang_creates > 0
        book.hang_creates -= int(hang)
    # the batch exists; its creator never hears of it
    if hang:
        book.hung.set()
        book.release.wait(60)
        handler.close_connection = True
        return
    handler._send(200, _view(handler.server, b))


def _view(srv, b: EmuBatch) -> dict[str, Any]:
    _end(srv, b)
    ended = b.results is not None
    n = len(b.lines)
    if b.api == "anthropic":
        counts = {k: b.counts.get(k, 0) for k in ("succeeded", "errored", "canceled", "expired")}
        return {
            "id": b.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": {"processing": 0 if ended else n, **counts},
            "created_at": _iso(b.created_at),
            "ended_at": _iso(time.time()) if ended else None,
            "results_url": f"{srv.url}/messages/batches/{b.id}/results" if ended else None,
        }
    status = "in_progress"
    if ended:
        status = "expired" if b.counts.get("expired") else "completed"
    return {
        "id": b.id,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "input_file_id": b.input_file_id,
        "completion_window": "24h",
        "status": status,
        "created_at": int(b.created_at),
        "metadata": b.metadata,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "request_counts": {
            "total": n,
            "completed": b.counts.get("succeeded", 0),
            "failed": n - b.counts.get("succeeded", 0) if ended else 0,
        },
    }


def _end(srv, b: EmuBatch) -> None:
    """Answer every request of ``b`` once, when the book says batches end (billed at the batch rate)."""
    book: BatchBook = srv.batches
    with book.lock:
        if b.ending or not book.end:
            return
        # this thread answers them; readers see it in progress until results are set
        b.ending = True
        fate = {}
        for cid, _ in b.lines:
            for kind, pool in (("expired", book.expire), ("errored", book.error), ("canceled", book.cancel)):
                if cid in pool:
                    pool.discard(cid)
                    fate[cid] = kind
                    break
    out, errs = [], []
    srv._billing.rate = book.rate
    try:
        for cid, body in b.lines:
            kind, status, ans = _answer(srv, b, body, fate.get(cid))
            b.counts[kind] = b.counts.get(kind, 0) + 1
            line, failed = _result_line(b.api, cid, kind, status, ans)
            (errs if failed else out).append(line)
    finally:
        srv._billing.rate = 1.0
    with book.lock:
        if b.api == "openai":
            if out:
                b.output_file_id = f"file-emu-out-{b.id}"
                book.files[b.output_file_id] = b"".join(orjson.dumps(r) + b"\n" for r in out)
            if errs:
                b.error_file_id = f"file-emu-err-{b.id}"
                book.files[b.error_file_id] = b"".join(orjson.dumps(r) + b"\n" for r in errs)
        b.results = out + errs


def _answer(srv, b: EmuBatch, body: dict[str, Any], fate: str | None) -> tuple[str, int, dict[str, Any]]:
    """``(kind, status, answer)`` of one batch request: its scripted fate (expired, errored, canceled), else
    what the synchronous endpoint answers (succeeded on 200, else errored)."""
    if fate is not None:
        return fate, 400, {"error": {"type": "invalid_request_error", "message": f"emulated {fate}"}}
    rules = srv.models.get(str(body.get("model")))
    if rules is None:
        status, ans = 404, {"error": {"message": f"model {body.get('model')!r} not found"}}
    elif b.api == "openai":
        status, ans = srv.openai(body, rules)
    else:
        status, ans = srv.anthropic(body, rules, b.heads)
    return ("succeeded" if status == 200 else "errored"), status, ans


def _result_line(api: str, cid: str, kind: str, status: int, ans: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """One request's result line as the provider writes it, and whether it goes to OpenAI's error file."""
    if api == "anthropic":
        res: dict[str, Any] = {"type": kind}
        if kind == "succeeded":
            res["message"] = ans
        elif kind == "errored":
            res["error"] = {"type": "error", "error": ans.get("error")}
        return {"custom_id": cid, "result": res}, False
    line: dict[str, Any] = {"id": f"batch_req_{cid[:8]}", "custom_id": cid}
    if kind == "succeeded":
        return {**line, "response": {"status_code": 200, "body": ans}, "error": None}, False
    if kind == "expired":
        error = {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
        return {**line, "response": None, "error": error}, True
    return {**line, "response": {"status_code": status, "body": ans}, "error": None}, True
