"""Records of one session -> streams, trace_messages rows and trace_states rows.

In:  the parsed main file and subagent files of one session (parser.ParsedFile).
Out: :class:`SessionBuild`: message rows (one per kept record: every record with a uuid, plus
salvaged damaged lines), state rows (one per assistant API response), per-file counters.

* Streams: the main conversation; each 1.0.x inline sidechain (``isSidechain`` records in the main
  file, grouped by their parentUuid root); each agent file (sibling 2.0.x or ``subagents/`` 2.1.x).
  Warmup agents (first user message ``Warmup``) are dropped and counted.
* Links: agent file -> the spawning tool_use via the Task/Agent result's ``toolUseResult.agentId``
  or 2.1.x ``agent_progress`` (``data.agentId`` + ``parentToolUseID``); inline sidechain -> the
  Task/Agent tool_use whose ``input.prompt`` equals the sidechain's first prompt (1.0.x has no
  agentId), in order for duplicates.
* A state = assistant records grouped by ``message.id`` (else ``requestId``, else ``uuid``),
  blocks merged in line order, usage of the last record; ``<synthetic>``/``isApiErrorMessage``
  responses are stored as messages (subtype ``synthetic``) but are not states.
* ``prefix_leaf_uuid`` = the parent of the response's first record (skipping its own records);
  ``n_prefix_messages`` is computed once per record with a memo over the parent chain (linear), using
  the same rules as render.render_state (tests check they agree on the real traces).
* ``error_after`` = results of this action's calls that are errors (``is_error`` or a string
  ``toolUseResult`` mentioning an error).

Deliberately simplified: ``agent_progress`` records (2.1.x copies of subagent messages inside the
main file) are pass-through chain links, not states, so a subagent is counted once, from its own
file; when that file is missing its actions are not reconstructed from the copies.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import orjson

from composer_pipeline.ingest.discover import agent_stream_meta
from composer_pipeline.ingest.parser import Block, ParsedFile, Record, loads_raw
from composer_pipeline.jsonutil import dumps
from composer_pipeline.render import RenderOptions, flatten_content

SPAWN_TOOLS = ("Task", "Agent")
ERROR_TEXT_CHARS = 2000


def state_id_of(session_key: str, stream_id: str, message_key: str) -> str:
    return hashlib.sha256(f"{session_key}|{stream_id}|{message_key}".encode()).hexdigest()[:20]


def _state_ids(session_key: str, stream_id: str, keys) -> list[str]:
    """``state_id_of`` for many keys of one stream: the shared prefix is hashed once."""
    base = hashlib.sha256(f"{session_key}|{stream_id}|".encode())
    out = []
    for k in keys:
        h = base.copy()
        h.update(k.encode())
        out.append(h.hexdigest()[:20])
    return out


def _dumps(v) -> bytes | None:
    """JSON as UTF-8 bytes, None for None (Arrow takes bytes for a string column: no decode)."""
    return None if v is None else dumps(v)


@dataclass
class Stream:
    stream_id: str
    # main | inline_sidechain | sibling_agent_file | subagents_dir
    kind: str
    file: str
    agent_id: str | None = None
    parent_tool_use_id: str | None = None
    records: list[Record] = field(default_factory=list)


@dataclass
class SessionBuild:
    messages: dict[str, list] = field(default_factory=dict)  # column -> values
    states: dict[str, list] = field(default_factory=dict)
    file_counts: dict[str, Counter] = field(default_factory=dict)  # rel file -> counters
    streams: int = 0
    warmup_dropped: int = 0


def _content(r: Record):
    m = r.message
    return m.content if m is not None else None


def _first_text(r: Record) -> str:
    c = _content(r)
    if type(c) is str:
        return c
    if type(c) is list:
        return "".join(b.text for b in c if b.type == "text" and type(b.text) is str)
    return ""


def _is_warmup(records: list[Record]) -> bool:
    for r in records:
        if r.type == "user":
            return _first_text(r).strip() == "Warmup"
    return False


def _tool_use_result_text(r: Record) -> str | None:
    """``toolUseResult`` when it is a string (error messages are), decoded only then."""
    raw = r.tool_use_result
    if raw and memoryview(raw)[0] == 34:  # '"': peek without copying the payload
        return orjson.loads(bytes(raw))
    return None


def _split_main(pf: ParsedFile, session_key: str) -> list[Stream]:
    main = Stream(f"{session_key}:main", "main", pf.path)
    side_by_uuid = {r.uuid: r for r in pf.records if r.is_sidechain is True and r.uuid}
    if not side_by_uuid:  # 2.x files: no inline sidechains
        main.records = [r for r in pf.records if r.uuid]
        return [main]
    root_of: dict[str, str] = {}
    sides: dict[str, Stream] = {}
    for r in pf.records:
        if not r.uuid:
            continue
        if r.is_sidechain is not True:
            main.records.append(r)
            continue
        # walk to the sidechain root (memoised), guarding against cycles
        chain, u = [], r.uuid
        while u in side_by_uuid and u not in root_of and u not in chain:
            chain.append(u)
            p = side_by_uuid[u].parent
            if p is None or p not in side_by_uuid:
                break
            u = p
        root = root_of.get(u, chain[-1] if chain else r.uuid)
        for c in chain:
            root_of[c] = root
        s = sides.get(root)
        if s is None:
            s = sides[root] = Stream(f"{session_key}:side-{root[:8]}", "inline_sidechain", pf.path)
        s.records.append(r)
    return [main, *sides.values()]


def _agent_stream(pf: ParsedFile, session_key: str) -> Stream:
    stream_id, kind, agent_id = agent_stream_meta(pf.path, session_key)
    s = Stream(stream_id, kind, pf.path, agent_id=agent_id)
    s.records = [r for r in pf.records if r.uuid]
    return s


def _link(streams: list[Stream], main: Stream | None) -> None:
    """Each agent stream's ``parent_tool_use_id``: the main stream's tool call that spawned it (agent files by
    their agentId, inline sidechains by their first prompt's text)."""
    if main is None:
        return
    by_agent: dict[str, str] = {}
    prompts: dict[str, list[str]] = {}
    for r in main.records:
        t = r.type
        if t == "progress":
            d = r.data
            if d is not None and d.agentId and r.parent_tool_use_id:
                by_agent.setdefault(str(d.agentId), str(r.parent_tool_use_id))
        elif t == "user":
            _link_agent_result(r, by_agent)
        elif t == "assistant":
            _link_spawn_prompts(r, prompts)
    for s in streams:
        if s.kind in ("sibling_agent_file", "subagents_dir"):
            s.parent_tool_use_id = by_agent.get(s.agent_id or "")
        elif s.kind == "inline_sidechain":
            first = next((r for r in s.records if r.type == "user"), None)
            ids = prompts.get(_first_text(first).strip()) if first else None
            if ids:
                s.parent_tool_use_id = ids.pop(0)


def _link_agent_result(r: Record, by_agent: dict[str, str]) -> None:
    """A user record holding a Task/Agent result names its agent: agentId -> the tool_use_id it answers."""
    raw = r.tool_use_result
    # a Task/Agent result names its agent: decode the payload only then (the line holds it)
    if raw and (type(r.raw) is str or b'"agentId"' in r.raw):
        tur = loads_raw(raw)
        if isinstance(tur, dict) and tur.get("agentId"):
            c = _content(r)
            ids = [b.tool_use_id for b in c if b.type == "tool_result"] if type(c) is list else []
            if ids:
                by_agent.setdefault(str(tur["agentId"]), str(ids[0]))


def _link_spawn_prompts(r: Record, prompts: dict[str, list[str]]) -> None:
    """An assistant record's spawn-tool calls: their prompt text -> the call ids, in order."""
    c = _content(r)
    if type(c) is list:
        for b in c:
            if b.type == "tool_use" and b.name in SPAWN_TOOLS:
                inp = b.input if isinstance(b.input, dict) else {}
                if isinstance(inp.get("prompt"), str):
                    prompts.setdefault(inp["prompt"].strip(), []).append(str(b.id))


_MSG_COLS = [
    "stream_id",
    "session_key",
    "uuid",
    "parent_uuid",
    "logical_parent_uuid",
    "record_type",
    "subtype",
    "message_key",
    "role",
    "is_meta",
    "is_compact_summary",
    "is_sidechain",
    "source_file",
    "line_no",
    "timestamp",
    "raw",
]
_STATE_COLS = [
    "state_id",
    "session_id",
    "session_key",
    "stream_id",
    "stream_kind",
    "agent_id",
    "parent_tool_use_id",
    "source_file",
    "source_lines",
    "record_uuids",
    "message_id",
    "request_id",
    "prefix_leaf_uuid",
    "n_prefix_messages",
    "action",
    "error_after",
    "has_error",
    "model",
    "version",
    "timestamp",
    "usage",
]


def _is_error_result(r: Record, block: Block) -> bool:
    if block.is_error is True:
        return True
    tur = _tool_use_result_text(r)
    return tur is not None and "error" in tur.lower()


def _uuid(r: Record) -> str:
    """A stream record's uuid: a stream holds only records that have one (:func:`_split_main`, :func:`_agent_stream`)."""
    if r.uuid is None:
        raise ValueError(f"{r.file}:{r.line_no}: a {r.type} record without a uuid in a stream")
    return r.uuid


class _StreamIndex:
    """Per-stream lookups shared by the prefix-count memo and error_after."""

    def __init__(self, s: Stream):
        # the first record wins for a duplicated uuid (reversed: earlier records are assigned last)
        self.by_uuid: dict[str, Record] = {_uuid(r): r for r in reversed(s.records)}
        # uuid -> message_key (assistant records)
        self.key: dict[str, str] = {}
        self.tools_of_key: dict[str, set[str]] = {}
        self.n_tools_of_key: dict[str, int] = {}
        self.tool_uses: dict[str, str] = {}
        self.results: dict[str, tuple[Record, Block]] = {}
        self.synthetic_keys: set[str] = set()
        # message_key -> the response's records (first appearance order)
        self.groups: dict[str, list[Record]] = {}
        # (index, subtype) where it is not the record's own
        self.subtype_fixes: list[tuple[int, str | None]] = []
        # compact boundaries whose logical parent is in this stream
        self.compactions = 0
        by_uuid, results, fixes = self.by_uuid, self.results, self.subtype_fixes
        for i, r in enumerate(s.records):
            t = r.type
            if t == "assistant":
                self._index_assistant(i, r)
            elif t == "user":
                m = r.message
                c = m.content if m is not None else None
                if type(c) is list:
                    for b in c:
                        if b.type == "tool_result":
                            results.setdefault(str(b.tool_use_id), (r, b))
            elif t == "progress":
                if r.data is not None:
                    fixes.append((i, r.data.type))
            elif t == "attachment":
                if r.attachment is not None:
                    fixes.append((i, r.attachment.type))
            elif t == "system":
                if r.subtype == "compact_boundary" and r.logical_parent is not None and r.logical_parent in by_uuid:
                    self.compactions += 1
        self._group(s)

    def _index_assistant(self, i: int, r: Record) -> None:
        """An assistant record: its message key, whether the response is synthetic, its tool calls."""
        m = r.message
        u = _uuid(r)
        k = str((m.id if m is not None else None) or r.request_id or u)
        self.key[u] = k
        if r.api_error is True or (m is not None and m.model == "<synthetic>"):
            self.synthetic_keys.add(k)
            self.subtype_fixes.append((i, "synthetic"))
        c = m.content if m is not None else None
        if type(c) is list:
            for b in c:
                if b.type == "tool_use":
                    bid = str(b.id)
                    self.tool_uses[bid] = str(b.name)
                    self.tools_of_key.setdefault(k, set()).add(bid)
                    self.n_tools_of_key[k] = self.n_tools_of_key.get(k, 0) + 1

    def _group(self, s: Stream) -> None:
        """A record sharing an assistant record's uuid joins its group (a second pass: keys are known now)."""
        key_get = self.key.get
        groups = self.groups
        for r in s.records:
            k = key_get(_uuid(r))
            if k is not None:
                g = groups.get(k)
                if g is None:
                    groups[k] = [r]
                else:
                    g.append(r)


_EMPTY: frozenset = frozenset()


def action_json_of(blocks: list[Block]) -> tuple[bytes, list[dict]]:
    """``render.action_from_blocks(blocks).to_json()`` and its tool calls as dicts, without building the
    frozen Action/ToolCall dataclasses (hot path: once per state). tests/ingest/test_fast_paths.py
    checks it equals the general code on every real state and on odd block lists. The JSON is UTF-8
    ``bytes`` (Arrow takes them for a string column without a decode)."""
    texts, thinking, calls = [], [], []
    for b in blocks:
        t = b.type
        if t == "text":
            texts.append(str(b.text or ""))
        elif t == "thinking":
            thinking.append(str(b.thinking or ""))
        elif t == "tool_use":
            args = b.input
            calls.append(
                {
                    "id": str(b.id or ""),
                    "name": str(b.name or ""),
                    "arguments": args if isinstance(args, dict) else {"input": args},
                }
            )
    text = "\n".join(t for t in texts if t and not t.isspace()).strip()  # (no per-block strip copies)
    return dumps({"text": text, "thinking": "\n".join(thinking).strip(), "tool_calls": calls}), calls


def _has_user_parts(content, known_tool_uses) -> bool:
    """``bool(render.user_parts(content, known_tool_uses))`` on parsed blocks, without building the parts."""
    if type(content) is str:
        return bool(content)
    if type(content) is not list:
        return False
    for b in content:
        t = b.type
        if t == "text":
            if b.text:
                return True
        elif t != "tool_result" or not (type(b.tool_use_id) is str and b.tool_use_id in known_tool_uses):
            # image, unknown block type, or an orphan tool result (known ids are strings)
            return True
    return False


def _prefix_counts(s: Stream, ix: _StreamIndex, opts: RenderOptions) -> dict[str, int]:
    """uuid -> ``2 * n + crossed``: n = rendered messages (incl. system) of a prefix ending at that
    record, crossed = it lies behind a crossed compaction. Read n as ``value >> 1``.

    Mirrors render.render_state: memo over parents, so the whole stream costs O(records)."""
    memo: dict[str, int] = {}
    by_uuid = ix.by_uuid
    tool_uses = ix.tool_uses
    memo_get = memo.get
    for r in s.records:
        u = _uuid(r)
        if u in memo:
            continue
        # the first record with this uuid, as _prefix_value() resolves it
        r = by_uuid[u]
        p = r.parent
        if p is not None and p != u:
            v = memo_get(p)
            # fast path (records come parent-first): one step on a known parent
            if v is not None:
                t = r.type
                if t == "user":
                    memo[u] = v + 2 * _user_count(r, v & 1, tool_uses)
                    continue
                if t == "assistant":
                    memo[u] = v + 2 * _assistant_count(r, ix)
                    continue
                if t != "system":
                    memo[u] = v
                    continue
        _prefix_value(u, memo, ix, opts)
    return memo


def _assistant_count(r: Record, ix: _StreamIndex) -> int:
    """Messages an assistant record adds to a prefix: its response and one per tool call, or 0 when the
    response is synthetic or already above it."""
    key_get = ix.key.get
    synthetic = ix.synthetic_keys
    k = key_get(_uuid(r))
    if k is None or k in synthetic:
        return 0
    # counted once per path: skip when the same response is already above (streaming split,
    # possibly through its own tool results and pass-through records)
    own = ix.tools_of_key.get(k, _EMPTY)
    by_uuid = ix.by_uuid
    u, hops = r.parent, 0
    while u and hops < 10000:
        hops += 1
        p = by_uuid.get(u)
        if p is None:
            break
        if p.type == "assistant":
            pk = key_get(_uuid(p))
            if pk == k:
                return 0
            if pk not in synthetic:
                break
        elif p.type == "user":
            c = _content(p)
            if not (type(c) is list and c and all(b.type == "tool_result" and str(b.tool_use_id) in own for b in c)):
                break
        u = p.parent
    return 1 + ix.n_tools_of_key.get(k, 0)


def _user_count(r: Record, crossed: int, tool_uses: dict[str, str]) -> int:
    """Messages a user record adds to a prefix: 1 when it renders a part, 0 for meta records and (behind a
    crossed compaction) the compact summary."""
    if r.is_meta is True or (crossed and r.is_compact_summary is True):
        return 0
    return 1 if _has_user_parts(_content(r), tool_uses) else 0


def _record_count(r: Record, crossed: int, ix: _StreamIndex) -> int:
    t = r.type
    if t == "assistant":
        return _assistant_count(r, ix)
    if t == "user":
        return _user_count(r, crossed, ix.tool_uses)
    return 0


def _prefix_value(u: str | None, memo: dict[str, int], ix: _StreamIndex, opts: RenderOptions) -> int:
    """The :func:`_prefix_counts` value of ``u``, filling ``memo`` for the unresolved chain above it;
    iterative: collect the chain, then fill the memo from the top down."""
    by_uuid = ix.by_uuid
    stack: list[Record] = []
    seen: set[str] = set()
    base = 2  # the system prompt, not crossed
    while u is not None:
        if u in memo:
            base = memo[u]
            break
        r = by_uuid.get(u)
        if r is None or u in seen:
            break
        seen.add(u)
        if r.type == "system" and r.subtype == "compact_boundary":
            lp = r.logical_parent
            if opts.compaction == "full" and lp is not None and lp in by_uuid and lp not in seen:
                memo[u] = (_prefix_value(lp, memo, ix, opts) & ~1) | 1
            else:
                memo[u] = 2
            base = memo[u]
            break
        stack.append(r)
        u = r.parent
    v = base
    crossed = v & 1
    for r in reversed(stack):
        v += 2 * _record_count(r, crossed, ix)
        memo[_uuid(r)] = v
    return v


def build_session(
    session_key: str, main: ParsedFile | None, agents: list[ParsedFile], opts: RenderOptions, drop_warmup: bool = True
) -> SessionBuild:
    out = SessionBuild()
    msg_cols: dict[str, list] = {c: [] for c in _MSG_COLS}
    state_rows: list[tuple] = []
    streams: list[Stream] = []
    main_stream = None
    if main is not None:
        streams = _split_main(main, session_key)
        main_stream = streams[0]
    for pf in agents:
        streams.append(_agent_stream(pf, session_key))
    kept = []
    for s in streams:
        if drop_warmup and s.kind != "main" and _is_warmup(s.records):
            out.warmup_dropped += 1
            out.file_counts.setdefault(s.file, Counter())["warmup_dropped"] += 1
            continue
        kept.append(s)
    _link(kept, main_stream)
    session_id = None
    for pf in ([main] if main else []) + agents:
        for r in pf.records:
            sid = r.session_id
            if isinstance(sid, str):
                session_id = sid
                break
        if session_id:
            break
    session_id = session_id or session_key.rsplit("__", 1)[-1]
    for s in kept:
        if not s.records:
            continue
        out.streams += 1
        fc = out.file_counts.setdefault(s.file, Counter())
        if s.kind != "main" and s.parent_tool_use_id:
            fc["subagents_linked"] += 1
        _emit_stream(s, session_key, session_id, opts, out, msg_cols, state_rows)
    out.messages = msg_cols
    # state rows -> column lists in one C-level transpose (cheaper than appending to each column per row)
    out.states = _columns(_STATE_COLS, state_rows)
    return out


def _columns(names: list[str], rows: list[tuple]) -> dict[str, list]:
    if not rows:
        return {c: [] for c in names}
    return {c: list(v) for c, v in zip(names, zip(*rows))}


def _emit_stream(
    s: Stream,
    session_key: str,
    session_id: str,
    opts: RenderOptions,
    out: SessionBuild,
    msg_cols: dict[str, list],
    state_rows: list[tuple],
) -> None:
    ix = _StreamIndex(s)
    key_get = ix.key.get
    by_uuid = ix.by_uuid
    recs = s.records
    n = len(recs)
    # trace_messages: one column at a time (a comprehension per column is cheaper than a row tuple)
    subtypes = [r.subtype for r in recs]
    for i, r in ix.subtype_fixes:
        subtypes[i] = r
    add = msg_cols
    add["stream_id"] += [s.stream_id] * n
    add["session_key"] += [session_key] * n
    add["uuid"] += [r.uuid for r in recs]
    add["parent_uuid"] += [r.parent for r in recs]
    add["logical_parent_uuid"] += [r.logical_parent for r in recs]
    add["record_type"] += [r.type for r in recs]
    add["subtype"] += [st if type(st) is str else None for st in subtypes]
    add["message_key"] += [None if r.damaged else key_get(_uuid(r)) for r in recs]
    add["role"] += [None if (m := r.message) is None else m.role for r in recs]
    add["is_meta"] += [r.is_meta is True for r in recs]
    add["is_compact_summary"] += [r.is_compact_summary is True for r in recs]
    add["is_sidechain"] += [r.is_sidechain is True for r in recs]
    add["source_file"] += [s.file] * n
    add["line_no"] += [r.line_no for r in recs]
    add["timestamp"] += [r.timestamp for r in recs]
    add["raw"] += [r.raw for r in recs]
    if ix.compactions:
        out.file_counts.setdefault(s.file, Counter())["compactions_crossed"] += ix.compactions

    counts = _prefix_counts(s, ix, opts)
    results_get = ix.results.get
    keys = [k for k in ix.groups if k not in ix.synthetic_keys]
    for k, state_id in zip(keys, _state_ids(session_key, s.stream_id, keys)):
        grp = ix.groups[k]
        first = grp[0]
        last = grp[-1]
        leaf = first.parent
        if len(grp) > 1:
            own = {r.uuid for r in grp}
            hops = 0
            while leaf is not None and leaf in own and hops < len(grp):
                leaf, hops = by_uuid[leaf].parent, hops + 1
        blocks = [b for r in grp if type(c := _content(r)) is list for b in c]
        action_json, calls = action_json_of(blocks)
        errors: list[dict[str, str]] | None = None
        for c in calls:
            res = results_get(c["id"])
            if res is not None and _is_error_result(*res):
                text = flatten_content(loads_raw(res[1].content)) or _tool_use_result_text(res[0]) or ""
                (errors := errors or []).append(
                    {"tool_use_id": c["id"], "tool_name": c["name"], "content": text[:ERROR_TEXT_CHARS]}
                )
        fm, lm = first.message, last.message
        mid = fm.id if fm is not None else None
        rid = first.request_id
        state_rows.append(
            (
                state_id,
                session_id,
                session_key,
                s.stream_id,
                s.kind,
                s.agent_id,
                s.parent_tool_use_id,
                s.file,
                [r.line_no for r in grp],
                [r.uuid for r in grp],
                mid if type(mid) is str else None,
                rid if type(rid) is str else None,
                leaf,
                counts[leaf] >> 1 if leaf in counts else 1,
                action_json,
                _dumps(errors),
                errors is not None,
                (lm.model if lm is not None else None) or (fm.model if fm is not None else None),
                last.version,
                first.timestamp,
                _dumps(lm.usage if lm is not None else None),
            )
        )
    if keys:
        out.file_counts.setdefault(s.file, Counter())["states"] += len(keys)
