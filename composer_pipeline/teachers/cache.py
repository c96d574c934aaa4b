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


class ResponseCache:
    """A directory of ``<call_id>.json`` records; safe under concurrent writers and ``kill -9``."""

    def __init__(self, dir: str | Path):
        self.dir = Path(dir).expanduser()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # an unwritable cache costs only speed: paid answers are stored in the ledger first (preflight warns)

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
            return None  # unreachable with atomic writes; a damaged file is re-fetched, not trusted
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
