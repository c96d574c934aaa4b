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

from composer_pipeline.ingest.parser import ParsedFile, Record
from composer_pipeline.render import RenderOptions, flatten_content

SPAWN_TOOLS = ("Task", "Agent")
ERROR_TEXT_CHARS = 2000


def state_id_of(session_key: str, stream_id: str, message_key: str) -> str:
    return hashlib.sha256(f"{session_key}|{stream_id}|{message_key}".encode()).hexdigest()[:20]


def _dumps(v) -> str | None:
    return None if v is None else orjson.dumps(v).decode()


def _dumpb(v) -> bytes | None:
    """JSON as UTF-8 bytes for message columns (Arrow string columns accept bytes: no decode)."""
    return None if v is None else orjson.dumps(v)


@dataclass
class Stream:
    stream_id: str
    kind: str  # main | inline_sidechain | sibling_agent_file | subagents_dir
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


def _message(r: Record) -> dict:
    return r.msg  # parsed once in parser.Record; {} when absent


def _message_key(r: Record) -> str:
    m = _message(r)
    k = m.get("id") or (r.obj.get("requestId") if r.obj else None) or r.uuid
    return str(k) if k is not None else f"line-{r.file}-{r.line_no}"


def _is_synthetic(r: Record) -> bool:
    return r.obj is not None and (r.obj.get("isApiErrorMessage") is True or _message(r).get("model") == "<synthetic>")


def _first_text(r: Record) -> str:
    c = _message(r).get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(b.get("text", "") for b in c if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _is_warmup(records: list[Record]) -> bool:
    for r in records:
        if r.type == "user":
            return _first_text(r).strip() == "Warmup"
    return False


def _split_main(pf: ParsedFile, session_key: str) -> list[Stream]:
    main = Stream(f"{session_key}:main", "main", pf.path)
    side_by_uuid = {r.uuid: r for r in pf.records if r.is_sidechain and r.uuid}
    root_of: dict[str, str] = {}
    sides: dict[str, Stream] = {}
    for r in pf.records:
        if not r.uuid:
            continue
        if not r.is_sidechain:
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
    name = pf.path.rsplit("/", 1)[-1]
    agent_id = name[len("agent-"):-len(".jsonl")] if name.startswith("agent-") else name
    kind = "subagents_dir" if "/subagents/" in f"/{pf.path}" else "sibling_agent_file"
    s = Stream(f"{session_key}:agent-{agent_id}", kind, pf.path, agent_id=agent_id)
    s.records = [r for r in pf.records if r.uuid]
    return s


def _link(streams: list[Stream], main: Stream | None) -> None:
    if main is None:
        return
    by_agent: dict[str, str] = {}
    prompts: dict[str, list[str]] = {}
    for r in main.records:
        if r.obj is None:
            continue
        if r.type == "progress":
            d = r.obj.get("data")
            if isinstance(d, dict) and d.get("agentId") and r.obj.get("parentToolUseID"):
                by_agent.setdefault(str(d["agentId"]), str(r.obj["parentToolUseID"]))
        elif r.type == "user":
            tur = r.obj.get("toolUseResult")
            if isinstance(tur, dict) and tur.get("agentId"):
                c = _message(r).get("content")
                ids = [b.get("tool_use_id") for b in c if isinstance(b, dict) and b.get("type") == "tool_result"] if isinstance(c, list) else []
                if ids:
                    by_agent.setdefault(str(tur["agentId"]), str(ids[0]))
        elif r.type == "assistant":
            c = _message(r).get("content")
            if isinstance(c, list):
                for b in c:
                    if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in SPAWN_TOOLS:
                        inp = b.get("input") if isinstance(b.get("input"), dict) else {}
                        if isinstance(inp.get("prompt"), str):
                            prompts.setdefault(inp["prompt"].strip(), []).append(str(b.get("id")))
    for s in streams:
        if s.kind in ("sibling_agent_file", "subagents_dir"):
            s.parent_tool_use_id = by_agent.get(s.agent_id or "")
        elif s.kind == "inline_sidechain":
            first = next((r for r in s.records if r.type == "user"), None)
            ids = prompts.get(_first_text(first).strip()) if first else None
            if ids:
                s.parent_tool_use_id = ids.pop(0)


_MSG_COLS = ["stream_id", "session_key", "uuid", "parent_uuid", "logical_parent_uuid", "record_type", "subtype",
             "message_key", "role", "content", "tool_use_result", "is_meta", "is_compact_summary", "is_sidechain",
             "source_file", "line_no", "timestamp", "raw"]
_STATE_COLS = ["state_id", "session_id", "session_key", "stream_id", "stream_kind", "agent_id", "parent_tool_use_id",
               "source_file", "source_lines", "record_uuids", "message_id", "request_id", "prefix_leaf_uuid",
               "n_prefix_messages", "action", "error_after", "has_error", "model", "version", "timestamp", "usage"]


def _tool_blocks(r: Record, kind: str) -> list[dict]:
    c = _message(r).get("content")
    if not isinstance(c, list):
        return []
    return [b for b in c if isinstance(b, dict) and b.get("type") == kind]


def _is_error_result(r: Record, block: dict) -> bool:
    if block.get("is_error") is True:
        return True
    tur = r.obj.get("toolUseResult") if r.obj else None
    return isinstance(tur, str) and "error" in tur.lower()


class _StreamIndex:
    """Per-stream lookups shared by the prefix-count memo and error_after."""

    def __init__(self, s: Stream):
        # the first record wins for a duplicated uuid (reversed: earlier records are assigned last)
        self.by_uuid: dict[str, Record] = {r.uuid: r for r in reversed(s.records)}
        self.key: dict[str, str] = {}  # uuid -> message_key (assistant records)
        self.tools_of_key: dict[str, set[str]] = {}
        self.n_tools_of_key: dict[str, int] = {}
        self.tool_uses: dict[str, str] = {}
        self.results: dict[str, tuple[Record, dict]] = {}
        self.synthetic_keys: set[str] = set()
        # inlined _message_key / _is_synthetic / _tool_blocks (hot: once per record)
        for r in s.records:
            o = r.obj
            if o is None:
                continue
            t = r.type
            if t == "assistant":
                m = r.msg
                k = m.get("id") or o.get("requestId") or r.uuid
                k = str(k) if k is not None else f"line-{r.file}-{r.line_no}"
                self.key[r.uuid] = k
                if o.get("isApiErrorMessage") is True or m.get("model") == "<synthetic>":
                    self.synthetic_keys.add(k)
                c = m.get("content")
                if type(c) is list:
                    for b in c:
                        if type(b) is dict and b.get("type") == "tool_use":
                            bid = str(b.get("id"))
                            self.tool_uses[bid] = str(b.get("name"))
                            self.tools_of_key.setdefault(k, set()).add(bid)
                            self.n_tools_of_key[k] = self.n_tools_of_key.get(k, 0) + 1
            elif t == "user":
                c = r.msg.get("content")
                if type(c) is list:
                    for b in c:
                        if type(b) is dict and b.get("type") == "tool_result":
                            self.results.setdefault(str(b.get("tool_use_id")), (r, b))


_EMPTY: frozenset = frozenset()


def action_json_of(blocks: list[dict]) -> tuple[str, list[dict]]:
    """``render.action_from_blocks(blocks).to_json()`` and its tool calls as dicts, without building the
    frozen Action/ToolCall dataclasses (hot path: once per state). tests/ingest/test_fast_paths.py
    checks it equals the general code on every real state and on odd block lists."""
    texts, thinking, calls = [], [], []
    for b in blocks:
        t = b.get("type")
        if t == "text":
            texts.append(str(b.get("text") or ""))
        elif t == "thinking":
            thinking.append(str(b.get("thinking") or ""))
        elif t == "tool_use":
            args = b.get("input")
            calls.append({"id": str(b.get("id") or ""), "name": str(b.get("name") or ""),
                          "arguments": args if isinstance(args, dict) else {"input": args}})
    text = "\n".join(t for t in texts if t.strip()).strip()
    return orjson.dumps({"text": text, "thinking": "\n".join(thinking).strip(), "tool_calls": calls}).decode(), calls


def _has_user_parts(content, known_tool_uses) -> bool:
    """``bool(render.user_parts(content, known_tool_uses))`` without building the parts (hot path)."""
    if isinstance(content, str):
        return bool(content)
    if not isinstance(content, list):
        return False
    for b in content:
        if not isinstance(b, dict):
            continue
        t = b.get("type")
        if t == "text":
            if b.get("text"):
                return True
        elif t != "tool_result" or b.get("tool_use_id") not in known_tool_uses:
            return True  # image, unknown block type, or an orphan tool result
    return False


def _prefix_counts(s: Stream, ix: _StreamIndex, opts: RenderOptions) -> dict[str, int]:
    """uuid -> number of rendered messages (incl. system) of a prefix ending at that record.

    Mirrors render.render_state: memo over parents, so the whole stream costs O(records)."""
    memo: dict[str, tuple[int, bool]] = {}

    def contrib(r: Record, crossed: bool) -> int:
        if r.type == "assistant":
            k = ix.key.get(r.uuid)
            if k is None or k in ix.synthetic_keys:
                return 0
            # counted once per path: skip when the same response is already above (streaming split,
            # possibly through its own tool results and pass-through records)
            own = ix.tools_of_key.get(k, _EMPTY)
            u, hops = r.parent, 0
            while u and hops < 10000:
                hops += 1
                p = ix.by_uuid.get(u)
                if p is None:
                    break
                if p.type == "assistant":
                    if ix.key.get(p.uuid) == k:
                        return 0
                    if ix.key.get(p.uuid) not in ix.synthetic_keys:
                        break
                elif p.type == "user":
                    c = _message(p).get("content")
                    if not (isinstance(c, list) and c and all(
                            isinstance(b, dict) and b.get("type") == "tool_result" and str(b.get("tool_use_id")) in own
                            for b in c)):
                        break
                u = p.parent
            return 1 + ix.n_tools_of_key.get(k, 0)
        if r.type == "user" and r.obj is not None:
            if r.obj.get("isMeta") is True or (crossed and r.obj.get("isCompactSummary") is True):
                return 0
            return 1 if _has_user_parts(r.msg.get("content"), ix.tool_uses) else 0
        return 0

    def value(u: str | None) -> tuple[int, bool]:
        # iterative: collect the unresolved chain, then fill the memo from the top down
        stack: list[Record] = []
        seen: set[str] = set()
        base = (1, False)
        while u is not None:
            if u in memo:
                base = memo[u]
                break
            r = ix.by_uuid.get(u)
            if r is None or u in seen:
                break
            seen.add(u)
            if r.obj is not None and r.obj.get("subtype") == "compact_boundary" and r.type == "system":
                lp = r.obj.get("logicalParentUuid")
                if opts.compaction == "full" and isinstance(lp, str) and lp in ix.by_uuid and lp not in seen:
                    memo[u] = (*value(lp)[:1], True)
                else:
                    memo[u] = (1, False)
                base = memo[u]
                break
            stack.append(r)
            u = r.parent
        n, crossed = base
        for r in reversed(stack):
            n += contrib(r, crossed)
            memo[r.uuid] = (n, crossed)
        return n, crossed

    by_uuid = ix.by_uuid
    for r in s.records:
        u = r.uuid
        if u in memo:
            continue
        r = by_uuid[u]  # the first record with this uuid, as value() resolves it
        p = r.parent
        if p is not None and p in memo and r.type != "system" and p != u:
            # fast path (records come parent-first): one step on top of a known parent
            n, crossed = memo[p]
            memo[u] = (n + contrib(r, crossed), crossed)
        else:
            value(u)
    return {k: v[0] for k, v in memo.items()}


def build_session(session_key: str, main: ParsedFile | None, agents: list[ParsedFile], opts: RenderOptions,
                  drop_warmup: bool = True) -> SessionBuild:
    out = SessionBuild()
    msg_rows: list[tuple] = []
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
            sid = r.get("sessionId")
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
        _emit_stream(s, session_key, session_id, opts, out, msg_rows, state_rows)
    # rows -> column lists in one C-level transpose (cheaper than appending to each column per row)
    out.messages = _columns(_MSG_COLS, msg_rows)
    out.states = _columns(_STATE_COLS, state_rows)
    return out


def _columns(names: list[str], rows: list[tuple]) -> dict[str, list]:
    if not rows:
        return {c: [] for c in names}
    return {c: list(v) for c, v in zip(names, zip(*rows))}


def _emit_stream(s: Stream, session_key: str, session_id: str, opts: RenderOptions, out: SessionBuild,
                 msg_rows: list[tuple], state_rows: list[tuple]) -> None:
    ix = _StreamIndex(s)
    dumps = orjson.dumps
    key_get = ix.key.get
    sid = s.stream_id
    append = msg_rows.append
    for r in s.records:
        o = r.obj
        t = r.type
        if o is None:  # salvaged damaged line
            append((sid, session_key, r.uuid, r.parent, None, "damaged", None, None, None, None, None,
                    False, False, r.is_sidechain, r.file, r.line_no, None, r.raw))
            continue
        get = o.get
        msg = r.msg
        st = get("subtype")
        if t == "assistant":
            if get("isApiErrorMessage") is True or msg.get("model") == "<synthetic>":  # _is_synthetic
                st = "synthetic"
        elif t == "progress":
            d = get("data")
            if type(d) is dict:
                st = d.get("type")
        elif t == "attachment":
            a = get("attachment")
            if type(a) is dict:
                st = a.get("type")
        lp = get("logicalParentUuid")
        if type(lp) is not str:
            lp = None
        if t == "system" and st == "compact_boundary" and lp is not None and lp in ix.by_uuid:
            out.file_counts.setdefault(r.file, Counter())["compactions_crossed"] += 1
        if msg:
            content = msg.get("content")
            role = msg.get("role")
        else:
            content = get("content") if t == "system" else None
            role = None
        tur = get("toolUseResult")
        ts = get("timestamp")
        append((sid, session_key, r.uuid, r.parent, lp, t, st if type(st) is str else None, key_get(r.uuid), role,
                None if content is None else dumps(content), None if tur is None else dumps(tur),
                get("isMeta") is True, get("isCompactSummary") is True, r.is_sidechain, r.file, r.line_no,
                ts if type(ts) is str else None, r.raw))

    # group assistant records into responses (first appearance order)
    groups: dict[str, list[Record]] = {}
    for r in s.records:  # by uuid, as before: a record sharing an assistant record's uuid joins its group
        k = key_get(r.uuid)
        if k is not None:
            groups.setdefault(k, []).append(r)
    counts = _prefix_counts(s, ix, opts)
    for k, recs in groups.items():
        if k in ix.synthetic_keys:
            continue
        first = recs[0]
        own = {r.uuid for r in recs}
        leaf, hops = first.parent, 0
        while leaf in own and hops < len(recs):
            leaf, hops = ix.by_uuid[leaf].parent, hops + 1
        blocks = [b for r in recs for b in (_message(r).get("content") or []) if isinstance(b, dict)]
        action_json, calls = action_json_of(blocks)
        errors = []
        for c in calls:
            cid = c["id"]
            res = ix.results.get(cid)
            if res and _is_error_result(*res):
                tur = res[0].obj.get("toolUseResult")
                text = flatten_content(res[1].get("content")) or (tur if isinstance(tur, str) else "")
                errors.append({"tool_use_id": cid, "tool_name": c["name"], "content": text[:ERROR_TEXT_CHARS]})
        last = recs[-1]
        lm = _message(last)
        version = last.get("version")
        row = (
            state_id_of(session_key, s.stream_id, k), session_id, session_key, s.stream_id, s.kind, s.agent_id,
            s.parent_tool_use_id, first.file, [r.line_no for r in recs], [r.uuid for r in recs],
            _message(first).get("id"), first.get("requestId"), leaf, counts.get(leaf, 1) if leaf else 1,
            action_json, _dumps(errors) if errors else None, bool(errors),
            lm.get("model") or _message(first).get("model"), version if isinstance(version, str) else None,
            first.get("timestamp"), _dumps(lm.get("usage")),
        )
        state_rows.append(row)
        out.file_counts.setdefault(first.file, Counter())["states"] += 1
