"""JSONL lines -> records, with quarantine and salvage. Never raises on file content.

In:  one session file (bytes), its path relative to the trace root, a :class:`Scrubber`.
Out: :class:`ParsedFile`: ``records`` (one :class:`Record` per JSON object line, in line order) and
``quarantine`` rows (tables.QUARANTINE) for every line that is not a JSON object: file, 1-based
line number, reason, scrubbed truncated text, and the ``uuid``/``parentUuid`` salvaged from the text
when the damage left them readable. A salvaged line becomes a ``damaged`` pass-through record so the
parentUuid chain through it is not broken.

The whole buffer is scrubbed before any parsing (see scrub.py), so nothing downstream sees a secret.
Deliberately simplified: a line with invalid UTF-8 is decoded with replacement characters and kept
(counted in ``utf8_repaired``) rather than quarantined, because its JSON structure is usually intact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from composer_pipeline.ingest.scrub import Scrubber

_UUID_RE = re.compile(r'"uuid"\s*:\s*"([0-9a-fA-F\-]{8,})"')
_PARENT_RE = re.compile(r'"parentUuid"\s*:\s*"([0-9a-fA-F\-]{8,})"')
_SIDECHAIN_RE = re.compile(r'"isSidechain"\s*:\s*true')


_NO_MESSAGE: dict = {}  # shared, never mutated


class Record:
    """One parsed line. ``obj`` is the decoded JSON object (``None`` for a salvaged damaged line);
    ``raw`` the scrubbed line as UTF-8 ``bytes`` (``str`` for a repaired or damaged line): Arrow
    takes either for a string column, so the hot path never decodes it."""

    __slots__ = ("line_no", "file", "obj", "msg", "raw", "type", "uuid", "parent", "is_sidechain")

    def __init__(self, line_no: int, file: str, obj: dict | None, raw: str, type_: str, uuid, parent, sidechain):
        self.line_no = line_no
        self.file = file
        self.obj = obj
        m = obj.get("message") if obj is not None else None
        self.msg = m if type(m) is dict else _NO_MESSAGE  # the API message (user/assistant records)
        self.raw = raw
        self.type = type_
        self.uuid = uuid
        self.parent = parent
        self.is_sidechain = sidechain

    def get(self, key: str, default: Any = None) -> Any:
        return self.obj.get(key, default) if self.obj is not None else default


@dataclass
class ParsedFile:
    path: str  # relative to the trace root
    records: list[Record] = field(default_factory=list)
    quarantine: list[dict] = field(default_factory=list)
    lines: int = 0
    utf8_repaired: int = 0
    empty: bool = False


def _quarantine(out: ParsedFile, session_key: str, line_no: int, reason: str, text: str, limit: int) -> None:
    u = _UUID_RE.search(text)
    p = _PARENT_RE.search(text)
    out.quarantine.append(
        {
            "session_key": session_key,
            "source_file": out.path,
            "line_no": line_no,
            "reason": reason,
            "text": text[:limit],
            "salvaged_uuid": u.group(1) if u else None,
            "salvaged_parent_uuid": p.group(1) if p else None,
        }
    )
    if u:  # keep the chain link: a pass-through record carrying only the salvaged ids
        out.records.append(
            Record(line_no, out.path, None, text, "damaged", u.group(1), p.group(1) if p else None,
                   bool(_SIDECHAIN_RE.search(text)))
        )


def parse_file(path: Path, rel: str, scrubber: Scrubber, session_key: str, quarantine_chars: int = 2000) -> ParsedFile:
    out = ParsedFile(rel)
    try:
        data = path.read_bytes()
    except OSError as e:
        _quarantine(out, session_key, 0, f"unreadable file: {e.strerror or e}", "", quarantine_chars)
        return out
    if not data.strip():
        out.empty = True
        return out
    data = scrubber.scrub_bytes(data)
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    out.lines = len(lines)
    loads = orjson.loads
    append = out.records.append
    for i, line in enumerate(lines, 1):
        try:
            obj = loads(line)
            raw = None
        except orjson.JSONDecodeError as e:
            raw = line.decode("utf-8", "replace")
            if not line.strip():
                _quarantine(out, session_key, i, "empty line", raw, quarantine_chars)
                continue
            try:  # invalid UTF-8 inside an otherwise valid line
                obj = loads(raw)
                out.utf8_repaired += 1
            except orjson.JSONDecodeError:
                _quarantine(out, session_key, i, f"invalid JSON: {e}", raw, quarantine_chars)
                continue
        if type(obj) is not dict:
            _quarantine(out, session_key, i, f"not a JSON object ({type(obj).__name__})",
                        raw or line.decode("utf-8", "replace"), quarantine_chars)
            continue
        t = obj.get("type")
        u = obj.get("uuid")
        p = obj.get("parentUuid")
        append(
            Record(i, rel, obj, raw or line, t if isinstance(t, str) else "<none>",
                   u if isinstance(u, str) else None, p if isinstance(p, str) else None,
                   obj.get("isSidechain") is True)
        )
    return out
