"""Content-addressed response cache: one JSON file per ``call_id``, written atomically.

In:  ``call_id`` = sha256 of ``teacher|model|base_url|canonical request body`` (see :func:`call_id`) and the
     teacher's response as it arrived (status 200, JSON), with its usage and cost.
Out: ``get(call_id)`` → the stored record or ``None``.

Each record is written the moment its response arrives: to a temporary file in the same directory,
fsync'ed, then ``os.replace``'d into ``<dir>/<id[:2]>/<id>.json``. A run killed with ``kill -9``
therefore leaves either a complete record or none, and a re-run never pays twice for an answer it
already received. Only successful responses are cached: failures are retried by the next run.
The cache is a fast copy: every paid answer is first stored with its claim in the ledger
(``ledger/``), so a cache that is read-only or full loses nothing (replay refills it from there).

The request body never contains the API key (it travels only in the ``Authorization`` header), so
neither the key nor anything derived from it reaches ``call_id`` or the cache files.
"""

from __future__ import annotations

import hashlib
import operator
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def call_id(teacher: str, model: str, body: dict[str, Any], base_url: str = "") -> str:
    """The request's content address: ``sha256(teacher|model|base_url|body)``, so the same name and model at
    another endpoint is another call (as the pair builder counts votes by ``base_url|model``). Without
    ``base_url``: the id of earlier versions, ``sha256(teacher|model|body)``, still looked up by replay for
    answers bought before (see ``legacy_call_id``)."""
    h = hashlib.sha256()
    h.update(f"{teacher}|{model}|".encode())
    if base_url:
        h.update(f"{base_url.rstrip('/')}|".encode())
    h.update(canonical_json(without_error_marks(body)))
    return h.hexdigest()


def without_error_marks(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the ``is_error`` marks of its tool messages (render.py sets them for Claude's
    ``tool_result``; OpenAI's tool messages have no such field). Not part of the call's id: an answer bought
    before the marks existed is the answer to the same request."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not any(isinstance(m, dict) and "is_error" in m for m in msgs):
        return body
    return {
        **body,
        "messages": [{k: v for k, v in m.items() if k != "is_error"} if isinstance(m, dict) else m for m in msgs],
    }


def legacy_call_id(teacher: str, model: str, body: dict[str, Any]) -> str:
    """The id earlier versions gave the same request (no endpoint in it): their cache files and ledger answers
    are served to the teacher that holds the name on the ledger (one identity per name, ``Ledger.check_identities``)."""
    return call_id(teacher, model, body)


# stands for the messages list while the rest of a body is serialized
_MESSAGES_SLOT = "\x00messages\x00"
_SLOT_JSON = b'"messages":"\\u0000messages\\u0000"'


class StreamCallIds:
    """:func:`call_id` and :func:`legacy_call_id` of one teacher's requests along one stream, hashing each
    message once: a state's messages usually extend the previous state's, so the hash state after the
    shared messages is kept and copied (``hashlib``'s ``copy``) instead of hashing the whole prefix again.
    The same ids as :func:`call_id` (the canonical body is the same bytes, fed in pieces); a body whose
    messages do not extend the previous one's (fitting moved its elision point) is hashed from its start.
    ``canonical`` gives a message's canonical JSON (memoized by the caller: messages are shared objects)."""

    def __init__(self, teacher: str, model: str, base_url: str, canonical: Any = canonical_json):
        self._starts = (f"{teacher}|{model}|{base_url.rstrip('/')}|".encode(), f"{teacher}|{model}|".encode())
        self._canonical = canonical
        self._frame: tuple[int, Any, bytes, bytes] | None = None  # (id(tools), tools, head, tail)
        self._messages: list[Any] = []
        self._hashes: list[Any] = []

    def _split(self, body: dict[str, Any]) -> tuple[bytes, bytes]:
        tools = body.get("tools")
        if self._frame is None or self._frame[0] != id(tools) or self._frame[1] is not tools:
            frame = canonical_json({**body, "messages": _MESSAGES_SLOT})
            # the top-level key: no other value holds NUL characters here
            at = frame.index(_SLOT_JSON)
            self._frame = (id(tools), tools, frame[:at] + b'"messages":[', b"]" + frame[at + len(_SLOT_JSON) :])
            self._messages = []  # another frame: start again
        return self._frame[2], self._frame[3]

    def ids(self, body: dict[str, Any]) -> tuple[str, str]:
        """(call_id, legacy_call_id) of ``body`` (== ``call_id(teacher, model, body, base_url)`` and
        ``legacy_call_id(teacher, model, body)``)."""
        head, tail = self._split(body)
        msgs = body["messages"]
        prev = self._messages
        if not prev or len(msgs) < len(prev) or not all(map(operator.is_, prev, msgs)):
            self._hashes = [hashlib.sha256(start + head) for start in self._starts]
            prev = []
        for i in range(len(prev), len(msgs)):
            msg = msgs[i]
            # not part of the id (see without_error_marks)
            if isinstance(msg, dict) and "is_error" in msg:
                msg = {k: v for k, v in msg.items() if k != "is_error"}
            piece = (b"," if i else b"") + self._canonical(msg)
            for h in self._hashes:
                h.update(piece)
        self._messages = list(msgs)
        out = []
        for h in self._hashes:
            done = h.copy()
            done.update(tail)
            out.append(done.hexdigest())
        return out[0], out[1]


class ResponseCache:
    """A directory of ``<call_id>.json`` records; safe under concurrent writers and ``kill -9``."""

    def __init__(self, dir: str | Path):
        self.dir = Path(dir).expanduser()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            # an unwritable cache costs only speed: paid answers are stored in the ledger first (preflight warns)
            pass

    def path(self, cid: str) -> Path:
        if len(cid) < 8 or not all(c in "0123456789abcdef" for c in cid):
            raise ValueError(f"not a call_id: {cid!r}")
        return self.dir / cid[:2] / f"{cid}.json"

    def get(self, cid: str) -> dict[str, Any] | None:
        p = self.path(cid)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        try:
            rec = orjson.loads(data)
        except orjson.JSONDecodeError:
            # unreachable with atomic writes; a damaged file is re-fetched, not trusted
            return None
        return rec if isinstance(rec, dict) and rec.get("call_id") == cid else None

    def __contains__(self, cid: str) -> bool:
        return self.get(cid) is not None

    def put(self, cid: str, record: dict[str, Any]) -> Path:
        p = self.path(cid)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = orjson.dumps({**record, "call_id": cid})
        fd, tmp = tempfile.mkstemp(prefix=f".{cid[:16]}.", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return p

    def __len__(self) -> int:
        return sum(1 for _ in self.dir.glob("*/*.json"))
