"""JSONL lines -> records, with quarantine and salvage. Never raises on file content.

In:  one session file (bytes), its path relative to the trace root, a :class:`Scrubber`.
Out: :class:`ParsedFile`: ``records`` (one :class:`Record` per JSON object line, in line order) and
``quarantine`` rows (tables.QUARANTINE) for every line that is not a JSON object: file, 1-based
line number, reason, scrubbed truncated text, and the ``uuid``/``parentUuid`` salvaged from the text
when the damage left them readable. A salvaged line becomes a ``damaged`` pass-through record so the
parentUuid chain through it is not broken. A record cut off before its ``uuid`` (a crash mid-write)
leaves the next record's parent unknown: :func:`bridge_damaged` then puts the pass-through record
back, under the uuid that child names, attached to the damaged line's salvaged ``parentUuid`` (on
through earlier damaged lines when that names none of the file's records; else to the nearest earlier
childless record of the same stream), so every later state keeps its history; a damaged record whose
own parent reference is unreadable is attached the same way. A damaged line still holding tool
results gets subtype ``tool_result_salvaged`` (salvage.py), which the renderer reads them back by.

The whole buffer is scrubbed before any parsing (see scrub.py), so nothing downstream sees a secret.

Decoding reads only what ingest uses. Each line is decoded by msgspec straight into the typed
:class:`Record` below: the keys it names become attributes, every other key (``cwd``, ``gitBranch``,
a tool result's payload, ``toolUseResult``, a progress record's copied message, thinking signatures:
most of the bytes) is skipped without building Python objects, and the two payloads ingest may need
later (``toolUseResult``, a tool result block's ``content``) stay undecoded JSON (``msgspec.Raw``).
The line itself is kept as ``raw`` for the message store. A line the typed decoder refuses (a key
with an unexpected type, a non-object, malformed JSON) goes through the general path: orjson into
dicts, then :func:`record_from_obj`, which applies the same reading rules leniently (a wrong-typed
value reads as absent) -- tests check both paths give equal records on every real line.

Deliberately simplified: a line with invalid UTF-8 is decoded with replacement characters and kept
(counted in ``utf8_repaired``) rather than quarantined, because its JSON structure is usually intact.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pyarrow as pa

from composer_pipeline.ingest.files import is_empty, read_session_file
from composer_pipeline.salvage import SALVAGED_RESULTS, salvaged_tool_results
from composer_pipeline.scrub import Scrubber

_UUID_RE = re.compile(r'"uuid"\s*:\s*"([0-9a-fA-F\-]{8,})"')
_PARENT_RE = re.compile(r'"parentUuid"\s*:\s*"([0-9a-fA-F\-]{8,})"')
_SIDECHAIN_RE = re.compile(r'"isSidechain"\s*:\s*(true|false)')
# a damaged root: its parent is known to be none
_ROOT_RE = re.compile(r'"parentUuid"\s*:\s*null')

# an absent payload (empty, falsy); JSON null is Raw(b"null")
NO_RAW = msgspec.Raw()


class Block(msgspec.Struct, gc=False):
    """One message content block: only the keys ingest reads. A tool result's ``content`` stays raw JSON."""

    type: Any = None
    text: Any = None
    thinking: Any = None
    id: Any = None
    name: Any = None
    input: Any = None
    tool_use_id: Any = None
    is_error: Any = None
    content: msgspec.Raw = NO_RAW


class Message(msgspec.Struct, gc=False):
    """The API message of a user/assistant record. ``content`` is a string or a list of blocks."""

    id: Any = None
    role: str | None = None
    model: str | None = None
    content: str | list[Block] | None = None
    usage: Any = None


class Data(msgspec.Struct, gc=False):
    """A progress record's ``data`` (its ``type``; ``agentId`` of a 2.1.x agent_progress)."""

    type: Any = None
    agentId: Any = None  # noqa: N815 (the JSON key)


class Attachment(msgspec.Struct, gc=False):
    type: Any = None


def _f(name: str, default: Any = None) -> Any:
    return msgspec.field(default=default, name=name)


class Record(msgspec.Struct, gc=False):
    """One parsed line: the keys ingest reads (JSON names in ``_f``), plus where it came from.

    ``raw`` is the scrubbed line as UTF-8 ``bytes`` (``str`` for a repaired or damaged line): Arrow
    takes either for a string column, so the hot path never decodes it. ``damaged``: a salvaged
    pass-through record (only ``uuid``/``parent``/``is_sidechain`` are known)."""

    type: str = "<none>"
    uuid: str | None = None
    parent: str | None = _f("parentUuid")
    logical_parent: str | None = _f("logicalParentUuid")
    # tested with ``is True``, like the other flags
    is_sidechain: Any = _f("isSidechain", False)
    is_meta: Any = _f("isMeta")
    is_compact_summary: Any = _f("isCompactSummary")
    subtype: Any = None
    session_id: Any = _f("sessionId")
    timestamp: str | None = None
    version: str | None = None
    request_id: Any = _f("requestId")
    api_error: Any = _f("isApiErrorMessage")
    parent_tool_use_id: Any = _f("parentToolUseID")
    message: Message | None = None
    tool_use_result: msgspec.Raw = _f("toolUseResult", NO_RAW)
    data: Data | None = None
    attachment: Attachment | None = None
    # set by the parser, never from JSON: msgspec would decode a JSON key of the same name into them,
    # so the parser overwrites all four after decoding ('@' names no Claude Code key)
    line_no: int = _f("@line_no", 0)
    file: str = _f("@file", "")
    raw: Any = _f("@raw")
    damaged: bool = _f("@damaged", False)


_decoder = msgspec.json.Decoder(Record)
_decode, _decode_lines = _decoder.decode, _decoder.decode_lines


def raw_json(v: Any) -> msgspec.Raw:
    return msgspec.Raw(orjson.dumps(v))


def loads_raw(raw: msgspec.Raw) -> Any:
    """Decode a kept payload (``None`` when absent or null, or when it cannot be decoded: msgspec keeps
    a payload holding a number beyond float range, e.g. ``1e400``, that orjson refuses)."""
    if not raw:
        return None
    try:
        return orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:
        return None


def block_from_dict(b: dict) -> Block:
    return Block(
        type=b.get("type"),
        text=b.get("text"),
        thinking=b.get("thinking"),
        id=b.get("id"),
        name=b.get("name"),
        input=b.get("input"),
        tool_use_id=b.get("tool_use_id"),
        is_error=b.get("is_error"),
        content=raw_json(b["content"]) if "content" in b else NO_RAW,
    )


def content_from_obj(c: Any) -> str | list[Block] | None:
    """A decoded ``message.content`` as the typed decoder reads it: a string, blocks (non-object
    entries skipped, as every reader of content does), or ``None`` for any other value."""
    if type(c) is list:
        return [block_from_dict(b) for b in c if type(b) is dict]
    return c if type(c) is str else None


def _str(v: Any) -> str | None:
    return v if type(v) is str else None


def record_from_obj(obj: dict) -> Record:
    """The general path: a decoded JSON object -> :class:`Record`, reading a wrong-typed value as absent."""
    g = obj.get
    m = g("message")
    msg = None
    if type(m) is dict:
        msg = Message(
            id=m.get("id"),
            role=_str(m.get("role")),
            model=_str(m.get("model")),
            content=content_from_obj(m.get("content")),
            usage=m.get("usage"),
        )
    d, a = g("data"), g("attachment")
    t = g("type")
    return Record(
        type=t if type(t) is str else "<none>",
        uuid=_str(g("uuid")),
        parent=_str(g("parentUuid")),
        logical_parent=_str(g("logicalParentUuid")),
        is_sidechain=g("isSidechain", False),
        is_meta=g("isMeta"),
        is_compact_summary=g("isCompactSummary"),
        subtype=g("subtype"),
        session_id=g("sessionId"),
        timestamp=_str(g("timestamp")),
        version=_str(g("version")),
        request_id=g("requestId"),
        api_error=g("isApiErrorMessage"),
        parent_tool_use_id=g("parentToolUseID"),
        message=msg,
        tool_use_result=raw_json(obj["toolUseResult"]) if "toolUseResult" in obj else NO_RAW,
        data=Data(type=d.get("type"), agentId=d.get("agentId")) if type(d) is dict else None,
        attachment=Attachment(type=a.get("type")) if type(a) is dict else None,
    )


@dataclass
class ParsedFile:
    path: str  # relative to the trace root
    records: list[Record] = field(default_factory=list)
    quarantine: list[dict] = field(default_factory=list)
    lines: int = 0
    utf8_repaired: int = 0
    empty: bool = False
    # damaged lines that look like a cut-off record without a readable uuid:
    # (line_no, salvaged parent, text, subtype: SALVAGED_RESULTS or None)
    cut: list[tuple[int, str | None, str, str | None]] = field(default_factory=list)
    # line numbers of damaged records (uuid salvaged) whose own parent reference / isSidechain is unreadable
    parent_lost: set[int] = field(default_factory=set)
    side_lost: set[int] = field(default_factory=set)
    # pass-through records bridge_damaged inserted (not counted in ``records`` of the report)
    bridged: int = 0


def _quarantine(out: ParsedFile, session_key: str, line_no: int, reason: str, text: str, limit: int) -> None:
    u = _UUID_RE.search(text)
    p = _PARENT_RE.search(text)
    sub = SALVAGED_RESULTS if salvaged_tool_results(text) else None
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
    # a record cut before its uuid: a bridge candidate
    if not u and line_no > 0 and text[:1] == "{":
        out.cut.append((line_no, p.group(1) if p else None, text, sub))
    # keep the chain link: a pass-through record carrying only the salvaged ids
    if u:
        side = _SIDECHAIN_RE.search(text)
        out.records.append(
            Record(
                type="damaged",
                uuid=u.group(1),
                parent=p.group(1) if p else None,
                is_sidechain=side is not None and side.group(1) == "true",
                subtype=sub,
                line_no=line_no,
                file=out.path,
                raw=text,
                damaged=True,
            )
        )
        # its parent reference was cut, garbled or is missing
        if not p and not _ROOT_RE.search(text):
            out.parent_lost.add(line_no)
        if side is None:
            out.side_lost.add(line_no)


def _general(out: ParsedFile, session_key: str, i: int, line: bytes, limit: int) -> Record | None:
    """orjson path for a line the typed decoder refused: repair, quarantine, or a lenient record."""
    raw: bytes | str
    try:
        obj = orjson.loads(line)
        raw = line
    except orjson.JSONDecodeError as e:
        text = line.decode("utf-8", "replace")
        if not line.strip():
            _quarantine(out, session_key, i, "empty line", text, limit)
            return None
        # invalid UTF-8 inside an otherwise valid line (else the same text fails the same way: not retried)
        try:
            if "\ufffd" not in text:
                raise e
            obj = orjson.loads(text)
            out.utf8_repaired += 1
        except orjson.JSONDecodeError:
            _quarantine(out, session_key, i, f"invalid JSON: {e}", text, limit)
            return None
        raw = text
    if type(obj) is not dict:
        _quarantine(
            out,
            session_key,
            i,
            f"not a JSON object ({type(obj).__name__})",
            raw if type(raw) is str else line.decode("utf-8", "replace"),
            limit,
        )
        return None
    r = record_from_obj(obj)
    r.raw = raw
    return r


def _valid_utf8(data: bytes) -> bool:
    """Whole-buffer UTF-8 check at SIMD speed (Arrow's validator; Python's decode is ~10x slower)."""
    if data.isascii():
        return True
    offsets = pa.py_buffer(array("i", [0, len(data)]))  # (int32)
    try:
        pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)]).validate(full=True)
        return True
    except pa.ArrowInvalid:
        return False


def parse_file(path: Path, rel: str, scrubber: Scrubber, session_key: str, quarantine_chars: int = 2000) -> ParsedFile:
    # (not unpacked: a check of the data narrows the reason too)
    read = read_session_file(path)
    if read[0] is None:
        out = ParsedFile(rel)
        _quarantine(out, session_key, 0, read[1], "", quarantine_chars)
        return out
    data = read[0]
    return parse_buffer(
        scrubber.scrub_bytes(data) if data and not data.isspace() else data, rel, session_key, quarantine_chars
    )


def parse_buffer(data: bytes, rel: str, session_key: str, quarantine_chars: int = 2000) -> ParsedFile:
    """One file's (already scrubbed) bytes -> records and quarantine rows."""
    out = ParsedFile(rel)
    if is_empty(data):
        out.empty = True
        return out
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    out.lines = len(lines)
    r: Record | None
    # msgspec skips the keys it does not read without checking their UTF-8, so a file with invalid
    # UTF-8 anywhere sends its lines through the general path, which repairs them as before
    if len(data) < 2**31 and _valid_utf8(data):
        # the whole file in one call (the common case: every line a well-formed record)
        try:
            records = _decode_lines(data)
        # (msgspec raises RecursionError on deep nesting)
        except (msgspec.DecodeError, RecursionError):
            records = None
        if records is not None and len(records) == len(lines):  # (blank lines would shift numbering)
            for i, r in enumerate(records):
                r.line_no = i + 1
                r.raw = lines[i]
                r.file = rel
                # (the bookkeeping fields are set here, never from a JSON key)
                r.damaged = False
            out.records = records
            return out
        decode = _decode
    else:
        decode = None
    append = out.records.append
    # line by line: find, repair or quarantine the bad ones
    for i, line in enumerate(lines, 1):
        if decode is not None:
            try:
                r = decode(line)
                r.raw = line
                r.damaged = False
            # malformed, a key of an unexpected type, too deep
            except (msgspec.DecodeError, RecursionError):
                r = _general(out, session_key, i, line, quarantine_chars)
                if r is None:
                    continue
        else:
            r = _general(out, session_key, i, line, quarantine_chars)
            if r is None:
                continue
        r.line_no = i
        r.file = rel
        append(r)
    bridge_damaged(out)
    return out


# records looked back over for a childless record to attach a damaged line to
LEAF_SCAN = 256


def bridge_damaged(pf: ParsedFile) -> int:
    """Re-attach records whose parent is unknown through the damaged lines that stood between.

    Walking the file in line order: a record whose ``parentUuid`` names no record of the file takes the
    nearest earlier damaged line not used yet (:attr:`ParsedFile.cut`) and gets it back as a ``damaged``
    pass-through record: uuid = the parent the record names, parent = the damaged line's salvaged
    ``parentUuid`` when that names a record; when it names no record and an earlier unused damaged
    line is left, the chain goes on through that line (a bridge under the salvaged uuid, attached the
    same way: chains of damaged lines in a row); else the record the damaged line most likely hung
    from (:func:`_attach_point`). Other records naming a bridged parent then find it too.
    A damaged record whose uuid was salvaged but whose own parent reference is unreadable (cut,
    garbled or missing; ``"parentUuid":null`` is a root and stays one) is attached the same way; one
    whose ``isSidechain`` is unreadable takes the flag of the latest record before it (a garbled flag
    must not move it, and the records hanging from it, into another stream). Returns the number of
    pass-through records inserted (also in ``pf.bridged``; a re-attached damaged record is not counted)."""
    if not pf.cut and not pf.parent_lost and not pf.side_lost:
        return 0
    recs = pf.records
    known = {r.uuid for r in recs if r.uuid}
    named = {r.parent for r in recs if r.parent}  # records that have a child
    cut, ci = pf.cut, 0
    unused: list[tuple[tuple[int, str | None, str, str | None], int, str | None, str | None]] = []  # nearest last
    # uuid of the latest record: [main, sidechain]
    last: list[str | None] = [None, None]
    bridges = []
    lost, side_lost = pf.parent_lost, pf.side_lost
    flag = False  # isSidechain of the latest record
    for i, r in enumerate(recs):
        while ci < len(cut) and cut[ci][0] < r.line_no:
            # (the cut line, records before it, latest uuids)
            unused.append((cut[ci], i, last[0], last[1]))
            ci += 1
        if r.damaged and r.line_no in side_lost:
            r.is_sidechain = flag
        p = r.parent
        side = r.is_sidechain is True
        if p is None and r.damaged and r.line_no in lost:
            r.parent = _attach_point(recs, i, side, named, last[side], last[not side])
            if r.parent is not None:
                named.add(r.parent)
        elif p and p not in known and unused:
            child = p
            parent: str | None
            while True:
                (line_no, salvaged, text, sub), before, before_main, before_side = unused.pop()
                go_on = salvaged is not None and salvaged not in known and salvaged != child and unused
                if salvaged is not None and (salvaged in known or go_on):
                    parent = salvaged
                else:
                    parent = _attach_point(recs, before, side, named, before_side if side else before_main, None)
                bridges.append(
                    Record(
                        type="damaged",
                        uuid=child,
                        parent=parent,
                        is_sidechain=side,
                        subtype=sub,
                        line_no=line_no,
                        file=pf.path,
                        raw=text,
                        damaged=True,
                    )
                )
                known.add(child)
                if parent is not None:
                    named.add(parent)
                if salvaged is None or not go_on:
                    break
                child = salvaged
        if r.uuid:
            last[side] = r.uuid
            flag = side
    if bridges:
        pf.records = sorted(recs + bridges, key=lambda r: r.line_no)  # (line numbers are unique)
        pf.bridged = len(bridges)
    return len(bridges)


def _attach_point(
    recs: list[Record], end: int, side: bool, named: set, nearest: str | None, other: str | None
) -> str | None:
    """The uuid a damaged line standing after ``recs[:end]`` most likely hung from: among the
    :data:`LEAF_SCAN` records before it, the nearest one with the ``isSidechain`` flag ``side`` that has
    no child (its child was the damaged line; parallel 1.0.x sidechains interleave, so the nearest
    record is often another sidechain's); else ``nearest`` (the latest record with that flag), else
    ``other`` (the latest record of the other flag, or ``None``)."""
    for j in range(end - 1, max(end - LEAF_SCAN, 0) - 1, -1):
        q = recs[j]
        if q.uuid and (q.is_sidechain is True) == side and q.uuid not in named:
            return q.uuid
    return nearest if nearest is not None else other


def classify_line(line: bytes, rel: str, session_key: str, line_no: int, quarantine_chars: int = 2000) -> tuple | None:
    """What :func:`parse_buffer` makes of one line of a valid UTF-8 file that the native reader
    refused: ``None`` if it is a record after all (only this Python reader can build it: the native
    path hands the session back), else the quarantine row's ``(reason, text, salvaged_uuid,
    salvaged_parent_uuid, salvaged_is_sidechain, parent_lost, subtype)``: ``salvaged_is_sidechain``
    ``None`` when unreadable, ``parent_lost`` when the salvaged record's own parent reference is, ``subtype`` :data:`SALVAGED_RESULTS` when
    the line still holds tool results (else ``None``)."""
    try:
        _decode(line)
        return None
    except (msgspec.DecodeError, RecursionError):
        pass
    out = ParsedFile(rel)
    if _general(out, session_key, line_no, line, quarantine_chars) is not None:
        return None
    q = out.quarantine[0]
    side = None if out.side_lost else bool(out.records and out.records[0].is_sidechain)
    sub = out.records[0].subtype if out.records else (out.cut[0][3] if out.cut else None)
    return q["reason"], q["text"], q["salvaged_uuid"], q["salvaged_parent_uuid"], side, bool(out.parent_lost), sub
