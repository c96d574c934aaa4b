"""Prefix renderer: a trace state's prefix -> the OpenAI chat request a teacher is sent (and ``show`` prints).

In:  ``trace_messages`` rows (one per kept record, tables.TRACE_MESSAGES) and a ``trace_states`` row.
Out: :class:`RenderedState` ``(messages, tools)``:

* ``messages``: system prompt, then the stream's conversation from its root to the state's
  ``prefix_leaf_uuid``, following ``parentUuid`` (not line order). Each assistant API response
  (records sharing ``message_key``) is ONE assistant message (text + ``tool_calls``); right after
  it, one ``tool`` message per tool call, found by ``tool_use_id`` anywhere in the stream (parallel
  calls put results on side branches). A call with no result seen before the state is answered
  ``"[interrupted: no result]"``, so every call is answered exactly once; a result only a damaged
  line still holds (ingest marks its row, salvage.py) is answered with what it holds, behind
  ``"[salvaged from a damaged line]"``. Meta, progress, system,
  snapshot and damaged records are skipped; user text/images become user messages; a tool result
  whose call is not in the stream (lost line) becomes user text. Thinking is embedded as
  ``<thinking>...</thinking>`` before the text unless ``strip_thinking``.
* Compaction: ``"after"`` (default) stops at the ``compact_boundary`` (the agent then saw the
  compact-summary user message and what follows); ``"full"`` jumps through ``logicalParentUuid``
  into the pre-compaction history and drops the now redundant summary message.
* Subagent streams start at the subagent's own prompt (a stream never walks into another stream).
* ``tools``: OpenAI function schemas of the tools the stream shows the agent using, with the
  argument keys observed (values untyped: ``{}``).

Every rendered message is scrubbed once more as the JSON it is sent as (:func:`_scrubbed_json`), after a
secret split across two blocks of a message (or two tool arguments) is redacted in both halves
(:func:`_seams_scrubbed`).

Deliberately simplified: the real Claude Code system prompt and tool descriptions are not in the
traces; ``system_prompt`` is a recipe option and tool schemas are inferred from usage.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
import pyarrow as pa

from composer_pipeline import codex_items, settings
from composer_pipeline.actions import ACTION_ORDERS, Action, ActionOrder, ToolCall
from composer_pipeline.jsonutil import dumps
from composer_pipeline.salvage import SALVAGED_MARK, SALVAGED_RESULTS, salvaged_tool_results
from composer_pipeline.settings import setting

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding agent working in the user's repository through tools. "
    "Read files before editing them, run commands to check your work, and answer with the next "
    "step: brief text and/or tool calls."
)
INTERRUPTED = "[interrupted: no result]"
IMAGE_PLACEHOLDER = "[image]"


@dataclass
class RenderOptions:
    """The ``render:`` section of ``recipes/ingest.yaml``."""

    strip_thinking: bool = setting(
        True, help="drop the agent's thinking blocks from the prefix (else <thinking>...</thinking>)"
    )
    compaction: Literal["after", "full"] = setting(
        "after", help="after: start at the last compaction (what the agent saw); full: the pre-compaction history too"
    )
    system_prompt: str = setting(DEFAULT_SYSTEM_PROMPT, help="system message of every rendered prefix")
    action_order: ActionOrder = setting(
        "sorted",
        help="key order of a tool call in completion text (the pairs' chosen/rejected_text, the trainer's "
        'completions and hints): sorted = {"arguments":{...},"name":...} (every key sorted); name_first = '
        '{"name":...,"arguments":{...}} (the decision first, as the Hermes/Qwen template writes it; the '
        "arguments' keys still sorted). Parsing reads both. Changing it changes the pairs' texts: rebuild them",
    )

    def __post_init__(self) -> None:
        if self.compaction not in ("after", "full"):
            raise ValueError(f"render.compaction must be 'after' or 'full', not {self.compaction!r}")
        if self.action_order not in ACTION_ORDERS:
            raise ValueError(f"render.action_order must be one of {ACTION_ORDERS}, not {self.action_order!r}")

    @classmethod
    def from_recipe(cls, recipe: str | Path | dict | None) -> RenderOptions:
        """From a dict (the ``render:`` section) or a recipe YAML path (reads its ``render:`` section)."""
        if recipe is None:
            return cls()
        if not isinstance(recipe, dict):
            return settings.from_dict(
                cls, settings.read_yaml(recipe, "render recipe").get("render"), str(recipe), "render"
            )
        return settings.from_dict(cls, recipe, "render options")


@dataclass
class RenderedState:
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return orjson.dumps({"messages": self.messages, "tools": self.tools}).decode()


# --- content helpers (also used by ingest.states) ------------------------------------------
def flatten_content(content: Any) -> str:
    """A message/tool_result ``content`` (string or block list) as plain text; images -> placeholder."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for b in content:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, dict):
                t = b.get("type")
                if t == "text":
                    parts.append(str(b.get("text") or ""))
                elif t == "image":
                    parts.append(IMAGE_PLACEHOLDER)
                elif t == "tool_result":
                    parts.append(flatten_content(b.get("content")))
                else:
                    parts.append(f"[{t}]")
        return "\n".join(parts)
    return dumps(content).decode()


def user_parts(content: Any, known_tool_uses: set | dict) -> list[str]:
    """User-visible parts of a user record: text, image placeholders, and orphan tool results."""
    if isinstance(content, str):
        return [content] if content else []
    parts: list[str] = []
    if not isinstance(content, list):
        return parts
    for b in content:
        if not isinstance(b, dict):
            continue
        t = b.get("type")
        if t == "text":
            if b.get("text"):
                parts.append(str(b["text"]))
        elif t == "image":
            parts.append(IMAGE_PLACEHOLDER)
        elif t == "tool_result":
            tid = b.get("tool_use_id")
            # (known ids are strings; an odd id may not hash)
            if not (type(tid) is str and tid in known_tool_uses):
                parts.append(f"[tool result for a call not in this transcript]\n{flatten_content(b.get('content'))}")
        else:
            parts.append(f"[{t}]")
    return parts


def action_from_blocks(blocks: list[dict]) -> Action:
    texts, thinking, calls = [], [], []
    for b in blocks:
        t = b.get("type")
        if t == "text":
            texts.append(str(b.get("text") or ""))
        elif t == "thinking":
            thinking.append(str(b.get("thinking") or ""))
        elif t == "tool_use":
            args = b.get("input")
            calls.append(
                ToolCall(
                    name=str(b.get("name") or ""),
                    arguments=args if isinstance(args, dict) else {"input": args},
                    id=str(b.get("id") or ""),
                )
            )
    text = "\n".join(t for t in texts if t.strip()).strip()
    return Action(text=text, tool_calls=tuple(calls), thinking="\n".join(thinking).strip())


def _blocks(content: Any) -> list[dict]:
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    if isinstance(content, str) and content:
        return [{"type": "text", "text": content}]
    return []


# --- conversation index ----------------------------------------------------------------------
@dataclass
class _Stream:
    by_uuid: dict[str, dict] = field(default_factory=dict)
    groups: dict[str, list[dict]] = field(default_factory=dict)
    results: dict[str, tuple[dict, dict]] = field(default_factory=dict)  # tool_use_id -> (row, block)
    tool_uses: dict[str, str] = field(default_factory=dict)  # tool_use_id -> name
    tools: dict[str, dict[str, None]] = field(default_factory=dict)  # name -> ordered keys


_COLUMNS = [
    "stream_id",
    "uuid",
    "parent_uuid",
    "logical_parent_uuid",
    "record_type",
    "subtype",
    "message_key",
    "is_meta",
    "is_compact_summary",
    "line_no",
    "raw",
    "source",
]


def record_payload(raw: str | bytes | None, record_type: str | None, source: str | None = None) -> tuple[Any, Any]:
    """``(content, toolUseResult)`` of a stored record, decoded from its ``raw`` line (``trace_messages``
    keeps the payload once, there): ``message.content`` (a system record's own ``content``); ``None``
    where absent or for a damaged line. A Codex rollout line (``source`` ``codex``) gives its content
    blocks (``codex_items.blocks_of``) and no tool result object."""
    if not raw or record_type == "damaged":
        return None, None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if type(obj) is not dict:
        return None, None
    if source == "codex":
        return (codex_items.blocks_of(obj) if record_type in ("user", "assistant") else None), None
    m = obj.get("message")
    if type(m) is dict and m:
        content = m.get("content")
    else:
        content = obj.get("content") if record_type == "system" else None
    return content, obj.get("toolUseResult")


_MISSING = object()


class Conversation:
    """``trace_messages`` rows indexed by stream and uuid (one or many sessions).

    The messages :func:`render_state` returns are shared between the states of a stream (made and
    scrubbed once each): callers copy a message before changing it."""

    def __init__(self) -> None:
        self.streams: dict[str, _Stream] = {}
        # rendered (and scrubbed) messages, each made once and shared by every state whose prefix holds it:
        # a stream's states cost what their new messages cost, not their whole prefix again (issue 30 #13)
        self._memo: dict[tuple, Any] = {}

    def _once(self, key: tuple, make: Any) -> Any:
        hit = self._memo.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._memo[key] = make()
        return hit

    @classmethod
    def from_table(cls, trace_messages: pa.Table) -> Conversation:
        conv = cls()
        cols = [c for c in _COLUMNS if c in trace_messages.column_names]
        for row in trace_messages.select(cols).to_pylist():
            conv._add(row)
        return conv

    def _add(self, row: dict) -> None:
        s = self.streams.get(row["stream_id"])
        if s is None:
            s = self.streams[row["stream_id"]] = _Stream()
        raw = row.pop("raw", None)
        row["_content"] = record_payload(raw, row.get("record_type"), row.pop("source", None))[0]
        u = row.get("uuid")
        if u and u not in s.by_uuid:
            s.by_uuid[u] = row
        rt = row.get("record_type")
        if rt == "damaged" and row.get("subtype") == SALVAGED_RESULTS and raw:
            for tid, text in salvaged_tool_results(raw if type(raw) is str else raw.decode("utf-8", "replace")):
                s.results.setdefault(
                    tid, (row, {"type": "tool_result", "tool_use_id": tid, "content": f"{SALVAGED_MARK}\n{text}"})
                )
        if rt == "assistant":
            key = row.get("message_key") or u
            if key is None:
                raise ValueError(f"{row['stream_id']}: an assistant record with neither a message key nor a uuid")
            s.groups.setdefault(key, []).append(row)
            for b in _blocks(row["_content"]):
                if b.get("type") == "tool_use":
                    s.tool_uses[str(b.get("id"))] = str(b.get("name"))
                    keys = s.tools.setdefault(str(b.get("name")), {})
                    if isinstance(b.get("input"), dict):
                        keys.update(dict.fromkeys(b["input"]))
        elif rt == "user" and isinstance(row["_content"], list):
            for b in row["_content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    s.results.setdefault(str(b.get("tool_use_id")), (row, b))

    def tool_schemas(self, stream_id: str) -> list[dict]:
        """The stream's tools as OpenAI function schemas, scrubbed (made once per stream; do not mutate)."""
        return self._once(("tools", stream_id), lambda: _scrubbed_json(self._tool_schemas(stream_id)))

    def _tool_schemas(self, stream_id: str) -> list[dict]:
        s = self.streams.get(stream_id)
        if s is None:
            return []
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"The {name} tool as used by the agent in this session.",
                    "parameters": {"type": "object", "properties": {k: {} for k in keys}},
                },
            }
            for name, keys in sorted(s.tools.items())
        ]


class _Records(Protocol):
    """What :func:`prefix_path` reads of a stream (this module's or ``workspace/history.py``'s)."""

    by_uuid: dict[str, dict]


def prefix_path(s: _Records, leaf: str | None, compaction: str) -> tuple[list[dict], bool]:
    """Records from the stream root to ``leaf`` along parentUuid (compaction per option); crossed?"""
    path: list[dict] = []
    seen: set[str] = set()
    crossed = False
    u = leaf
    while u and u not in seen:
        seen.add(u)
        row = s.by_uuid.get(u)
        if row is None:
            break
        if row.get("subtype") == "compact_boundary":
            lp = row.get("logical_parent_uuid")
            if compaction == "full" and lp and lp in s.by_uuid:
                crossed = True
                u = lp
                continue
            break
        path.append(row)
        u = row.get("parent_uuid")
    path.reverse()
    return path, crossed


def _assistant_message(rows: list[dict], strip_thinking: bool) -> tuple[dict, list[tuple[str, str]]]:
    blocks = [b for r in sorted(rows, key=lambda r: r["line_no"] or 0) for b in _blocks(r["_content"])]
    action = action_from_blocks(_seams_scrubbed(blocks))
    msg = action.to_chat_message()
    if not strip_thinking and action.thinking:
        msg["content"] = f"<thinking>{action.thinking}</thinking>" + (f"\n{action.text}" if action.text else "")
    return _scrubbed_json(msg), [(c.id, c.name) for c in action.tool_calls]


def render_state(conv: Conversation, state: dict, opts: RenderOptions | None = None) -> RenderedState:
    return _render(conv, state, opts or RenderOptions(), None)[0]


@dataclass
class _Walk:
    """What rendering one state's prefix left behind, for the next state of its stream to extend."""

    leaf: str | None
    messages: list[dict]
    emitted: set[str]  # assistant message keys rendered
    # the path went through a compaction into the earlier history
    crossed: bool
    # a row of the state's own message was in its path (left out)
    skipped_own: bool
    # lines of the results rendered INTERRUPTED (a later state may have seen them)
    pending: list[int]
    # the latest line of a result rendered as seen
    last_seen: int


class StreamRenderer:
    """:func:`render_state` for many states of one :class:`Conversation`: a state whose prefix extends the
    previous state's of the same stream (the usual case, states taken in stream order) renders only the
    records after that prefix and reuses the rest (the same messages, the same objects), so a stream of
    ``n`` states costs about ``n`` renders of one turn, not ``n`` renders of its whole prefix. Anything that
    could render the shared part differently (the state's own message or a result seen in between, another
    branch, a compaction) renders the state from its root."""

    def __init__(self, conv: Conversation, opts: RenderOptions | None = None) -> None:
        self.conv, self.opts = conv, opts or RenderOptions()
        self._last: dict[str, _Walk] = {}

    def render(self, state: dict) -> RenderedState:
        rendered, walk = _render(self.conv, state, self.opts, self._last.get(state["stream_id"]))
        if walk is not None:
            self._last[state["stream_id"]] = walk
        return rendered


def _state_keys(state: dict) -> tuple[Any, int | None]:
    own_key = state.get("message_id") or state.get("request_id") or (state.get("record_uuids") or [None])[0]
    src = state.get("source_lines") or []
    return own_key, (min(src) if src else None)


def _extension(s: _Stream, state: dict, last: _Walk | None) -> list[dict] | None:
    """The records after ``last``'s prefix up to this state's leaf, when this state's prefix renders as
    ``last``'s plus them; else None."""
    if last is None or last.leaf is None or last.skipped_own:
        return None
    own_key, first_line = _state_keys(state)
    if own_key in last.emitted:
        return None
    if any(first_line is None or line < first_line for line in last.pending):
        return None
    if first_line is not None and last.last_seen >= first_line:
        return None
    rows: list[dict] = []
    u = state.get("prefix_leaf_uuid")
    seen: set[str] = set()
    while u != last.leaf:
        if not u:
            return None
        row = s.by_uuid.get(u)
        if row is None or u in seen or row.get("subtype") == "compact_boundary":
            return None
        seen.add(u)
        rows.append(row)
        u = row.get("parent_uuid")
    rows.reverse()
    return rows


def _render(
    conv: Conversation, state: dict, opts: RenderOptions, last: _Walk | None
) -> tuple[RenderedState, _Walk | None]:
    sid = state["stream_id"]
    s = conv.streams.get(sid)
    system = conv._once(("system", opts.system_prompt), lambda: _scrubbed_json(_system(opts.system_prompt)))
    if s is None:
        return RenderedState([system], []), None
    own_key, first_line = _state_keys(state)
    rows = _extension(s, state, last)
    if rows is not None and last is not None:
        walk = _Walk(
            state.get("prefix_leaf_uuid"),
            list(last.messages),
            last.emitted,
            last.crossed,
            False,
            last.pending,
            last.last_seen,
        )
    else:
        rows, crossed = prefix_path(s, state.get("prefix_leaf_uuid"), opts.compaction)
        walk = _Walk(state.get("prefix_leaf_uuid"), [system], set(), crossed, False, [], -1)
    messages, emitted = walk.messages, walk.emitted
    for row in rows:
        rt = row["record_type"]
        if rt == "assistant":
            key = row.get("message_key") or row["uuid"]
            if key == own_key:
                walk.skipped_own = True
            if key in emitted or key == own_key:
                continue
            group = s.groups.get(key, [row])
            if any(_is_synthetic_row(r) for r in group):
                continue
            emitted.add(key)
            msg, calls = conv._once(
                ("assistant", sid, key, opts.strip_thinking), lambda: _assistant_message(group, opts.strip_thinking)
            )
            messages.append(msg)
            for call_id, _name in calls:
                res = s.results.get(call_id)
                line = (res[0]["line_no"] or 0) if res is not None else None
                seen_before = line is not None and (first_line is None or line < first_line)
                if line is not None:
                    if seen_before:
                        walk.last_seen = max(walk.last_seen, line)
                    else:
                        walk.pending = [*walk.pending, line]
                messages.append(
                    conv._once(
                        ("tool", sid, call_id, seen_before),
                        lambda: _tool_message(call_id, res if seen_before else None),
                    )
                )
        elif rt == "user":
            if row.get("is_meta") or (walk.crossed and row.get("is_compact_summary")):
                continue
            kept = codex_items.kept_messages(row["_content"]) if row.get("subtype") == "compacted" else []
            # a Codex compaction: the messages it kept, each with its role
            if kept:
                messages.extend(conv._once(("kept", sid, id(row)), lambda: _kept_messages(kept, s)))
                continue
            msg = conv._once(("user", sid, id(row)), lambda: _user_message(row, s))
            if msg is not None:
                messages.append(msg)
    return RenderedState(list(messages), conv.tool_schemas(sid)), walk


def _system(prompt: str) -> dict:
    return {"role": "system", "content": prompt}


def _tool_message(call_id: str, res: tuple[dict, dict] | None) -> dict:
    """The tool message answering ``call_id``: its result's text, or :data:`INTERRUPTED` (``res`` None: the
    state came before its result), scrubbed."""
    content = flatten_content(res[1].get("content")) if res is not None else INTERRUPTED
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
    # for Claude's tool_result (anthropic.py)
    if res is not None and res[1].get("is_error") is True:
        msg["is_error"] = True
    return _scrubbed_json(msg)


def _kept_messages(kept: list[tuple[str, list[dict]]], s: _Stream) -> list[dict]:
    out = []
    for role, blocks in kept:
        parts = _egress().scrub_seams(user_parts(blocks, s.tool_uses))
        if parts:
            out.append(_scrubbed_json({"role": role, "content": "\n\n".join(parts)}))
    return out


def _user_message(row: dict, s: _Stream) -> dict | None:
    parts = _egress().scrub_seams(user_parts(row["_content"], s.tool_uses))
    return _scrubbed_json({"role": "user", "content": "\n\n".join(parts)}) if parts else None


# the built-in secret patterns, for _scrubbed_json
_EGRESS = None


def _egress():
    global _EGRESS
    if _EGRESS is None:
        from composer_pipeline.scrub import Scrubber

        _EGRESS = Scrubber()
    return _EGRESS


def _seams_scrubbed(blocks: list[dict]) -> list[dict]:
    """The blocks of one assistant message with a secret split across two of them redacted in both
    (``Scrubber.scrub_seams``): the text blocks in order, the thinking blocks, and the string arguments
    of its tool calls in order. Ingest scrubs each block's line alone, where each half matches nothing;
    rendered, the halves stand next to each other."""
    if len(blocks) < 2 and not any(b.get("type") == "tool_use" for b in blocks):
        return blocks
    out = [dict(b) for b in blocks]
    for typ, field_ in (("text", "text"), ("thinking", "thinking")):
        idx = [i for i, b in enumerate(out) if b.get("type") == typ and isinstance(b.get(field_), str) and b[field_]]
        if len(idx) > 1:
            for i, new in zip(idx, _egress().scrub_seams([out[i][field_] for i in idx])):
                out[i][field_] = new
    calls = [i for i, b in enumerate(out) if b.get("type") == "tool_use"]
    leaves: list[str] = []
    for i in calls:
        _strings_in(out[i].get("input"), leaves)
    if len(leaves) > 1:
        clean = _egress().scrub_seams(leaves)
        if clean != leaves:
            it = iter(clean)
            for i in calls:
                out[i]["input"] = _with_strings(out[i].get("input"), it)
    return out


def _strings_in(v: Any, out: list[str]) -> None:
    """The string values in ``v`` (object values and list items, depth first, in order)."""
    if isinstance(v, str):
        out.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _strings_in(x, out)
    elif isinstance(v, list):
        for x in v:
            _strings_in(x, out)


def _with_strings(v: Any, it) -> Any:
    """``v`` with its string values (in :func:`_strings_in` order) taken from ``it``."""
    if isinstance(v, str):
        return next(it)
    if isinstance(v, dict):
        return {k: _with_strings(x, it) for k, x in v.items()}
    if isinstance(v, list):
        return [_with_strings(x, it) for x in v]
    return v


def _scrubbed_json(obj: Any) -> Any:
    """A rendered message (or the tools list) scrubbed once more, in the form it leaves the machine in
    (defense in depth); each message once, where it is made (messages are shared by the states of a stream).

    Ingest already scrubbed the raw lines (escape-aware, scrub.py). Here the decoded text is
    re-encoded by orjson (which escapes no ASCII letter), so a key that a writer had spelled with
    escapes (``s\\u006b-...``), invisible in the raw line, is visible and caught. One Hyperscan pass
    over the JSON; the exact patterns run only on the rare candidate lines (one line here)."""
    data = orjson.dumps(obj)
    clean = _egress().scrub_bytes(data)
    if clean is data or clean == data:
        return obj
    return orjson.loads(clean)


def _is_synthetic_row(row: dict) -> bool:
    """``<synthetic>`` / ``isApiErrorMessage`` responses: stored with subtype ``synthetic``, never sent."""
    return row.get("subtype") == "synthetic"


def render_states(
    states: pa.Table, messages: pa.Table, opts: RenderOptions | None = None
) -> Iterator[tuple[str, RenderedState]]:
    conv = Conversation.from_table(messages)
    for st in states.to_pylist():
        yield st["state_id"], render_state(conv, st, opts)


def action_of(state_row: dict) -> Action:
    """The agent's own action of a ``trace_states`` row."""
    return Action.from_json(state_row["action"])


# --- fitting a prefix into a teacher's window ---------------------------------------------------
# Token counts without the teacher's tokenizer: a conservative bytes-per-token ratio. Real prompts
# (English, code, JSON) average 3.5–4.5 bytes per token on GPT/Claude/Qwen-class BPE tokenizers; 3.0
# counts more tokens than they have, so a fitted request lands under the window; a provider that still
# answers "too long" gets one tighter refit (replay). Source for the ratios: the measurement in
# the project's provider notes, shared/notes/providers.md beside the checkout (31 real sessions at 4 and
# 3.2 bytes per token).
FIT_BYTES_PER_TOKEN = 3.0
# role markers and separators of chat templates
FIT_TOKENS_PER_MESSAGE = 8
FIT_TOKENS_FIXED = 32  # generation prompt, tool-list framing
# a window must hold the system prompt plus at least this much of one turn
MIN_TURN_TOKENS = 256
ELIDED_MARKER = "[{n} earlier messages elided to fit the teacher's context window]"
CUT_MARKER = "\n[... {n} characters cut to fit the teacher's context window ...]\n"


def count_tokens(obj: Any, bytes_per_token: float = FIT_BYTES_PER_TOKEN, n_bytes: int | None = None) -> int:
    """Tokens of one message (or the tools list) as sent: its JSON bytes (``n_bytes`` when already
    measured) / ``bytes_per_token``, rounded up."""
    n = len(orjson.dumps(obj)) if n_bytes is None else n_bytes
    return -(-n * 1000 // int(bytes_per_token * 1000)) + FIT_TOKENS_PER_MESSAGE


class JsonSizes:
    """The JSON bytes of each message (or tools list) object, measured once: the states of a stream share
    their messages (:class:`Conversation`), so fitting and pricing a stream's requests measure each
    message once instead of once per state. Keeps the objects it measured (an ``id`` is never reused)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, int]] = {}
        # key -> (the last list measured, its bytes)
        self._lists: dict[Any, tuple[list[Any], int]] = {}
        self._prefixes: dict[Any, _Prefix] = {}

    def __call__(self, obj: Any) -> int:
        hit = self._by_id.get(id(obj))
        if hit is None:
            hit = self._by_id[id(obj)] = (obj, len(orjson.dumps(obj)))
        return hit[1]

    def prefix(self, key: Any) -> _Prefix:
        """The running sums :func:`fit_messages` keeps under ``key``."""
        pre = self._prefixes.get(key)
        if pre is None:
            pre = self._prefixes[key] = _Prefix()
        return pre

    def of_list(self, items: list[Any] | None, key: Any = None) -> int:
        """Bytes of ``orjson.dumps(items)``: the brackets, the items and the commas between them. With a
        ``key`` (e.g. a teacher's stream), a list that extends the last one measured under it (the same
        objects first) adds only its new items."""
        if not items:
            return 2
        prev, total = self._lists.get(key, ((), 0)) if key is not None else ((), 0)
        if prev and len(items) >= len(prev) and all(map(operator.is_, prev, items)):
            total += sum(self(x) for x in items[len(prev) :]) + len(items) - len(prev)
        else:
            total = 1 + sum(self(x) for x in items) + len(items)
        if key is not None:
            self._lists[key] = (items, total)
        return total


def min_window(max_tokens: int, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> int:
    """The smallest ``context_window`` that holds the system prompt, one turn and the answer."""
    return (
        count_tokens({"role": "system", "content": system_prompt})
        + FIT_TOKENS_FIXED
        + MIN_TURN_TOKENS
        + int(max_tokens)
    )


@dataclass
class Fitted:
    """A prefix fitted into a token budget: the messages (and tools) to send and what was done to them.

    ``fits`` is False when even the fitted prefix is over the budget (e.g. one turn of hundreds of parallel
    calls, each answered): such a request is never sent (replay records it ``over_context_window``)."""

    messages: list[dict[str, Any]]
    # messages replaced by the marker (the marker itself not counted)
    elided: int = 0
    # messages (and the tools list) whose content or tool-call arguments were cut in the middle
    cut: int = 0
    # estimated prompt tokens of the result (tools included)
    tokens: int = 0
    # the tools as sent (argument names dropped when too many)
    tools: list[dict[str, Any]] | None = None
    fits: bool = True

    @property
    def changed(self) -> bool:
        return bool(self.elided or self.cut)


# a text shorter than this is not worth a cut marker
MIN_CUT_CHARS = 64


def _cut_text(text: str, drop: int) -> str:
    keep = max(0, len(text) - drop)
    head, tail = text[: keep // 2], text[len(text) - (keep - keep // 2) :] if keep else ""
    return head + CUT_MARKER.format(n=len(text) - keep) + tail


def _texts(msg: dict) -> tuple[list[str], list[Any]]:
    """The cuttable texts of a message: its string content, then the string values inside each tool call's
    arguments (decoded: a cut keeps the arguments valid JSON; arguments that are not JSON are one text);
    and the decoded arguments per call (None: not JSON)."""
    texts: list[str] = [msg["content"]] if isinstance(msg.get("content"), str) else []
    decoded: list[Any] = []
    for call in msg.get("tool_calls") or []:
        raw = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
        args = None
        if isinstance(raw, str):
            try:
                args = orjson.loads(raw)
            except orjson.JSONDecodeError:
                texts.append(raw)
            else:
                _strings_in(args, texts)
        decoded.append(args)
    return texts, decoded


def _with_texts(msg: dict, decoded: list[Any], texts: list[str]) -> dict:
    """``msg`` with its :func:`_texts` replaced, in the same order."""
    it = iter(texts)
    out = dict(msg)
    if isinstance(msg.get("content"), str):
        out["content"] = next(it)
    if msg.get("tool_calls"):
        calls = []
        for call, args in zip(msg["tool_calls"], decoded):
            raw = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            if not isinstance(raw, str):
                calls.append(call)
                continue
            new = next(it) if args is None else orjson.dumps(_with_strings(args, it)).decode()
            calls.append({**call, "function": {**call["function"], "arguments": new}})
        out["tool_calls"] = calls
    return out


def _cut_middle(msg: dict, max_tokens: int, bpt: float, tok: Any) -> dict:
    """``msg`` cut so that it counts (``tok``) at most ``max_tokens`` where it can be: its largest texts (the
    content, or a string inside a tool call's arguments, e.g. a 5 MB ``Write``) lose their middle, largest
    first, each behind one marker saying how many characters went."""
    over = tok(msg) - max_tokens
    if over <= 0:
        return msg
    texts, decoded = _texts(msg)
    if not texts:
        return msg
    n_content = 1 if isinstance(msg.get("content"), str) else 0
    drops = [0] * len(texts)
    out = msg
    # each pass cuts more of the largest text still long; a few passes in practice
    for _ in range(256):
        i = max(range(len(texts)), key=lambda j: len(texts[j]) - drops[j])
        left = len(texts[i]) - drops[i]
        if left < MIN_CUT_CHARS:
            break
        # bytes to drop: the overrun at the ratio, plus the marker, as characters of this text at its bytes
        # per character as sent (UTF-8 and JSON escapes; an argument's string is escaped twice); re-checked
        sent = orjson.dumps(texts[i]) if i < n_content else orjson.dumps(orjson.dumps(texts[i]).decode())
        per_char = max(1.0, len(sent) / max(1, len(texts[i])))
        more = int((over * bpt + len(CUT_MARKER)) / per_char) + 16
        drops[i] = min(len(texts[i]), drops[i] + max(more, MIN_CUT_CHARS, drops[i] // 4))
        cut = [_cut_text(t, d) if d else t for t, d in zip(texts, drops)]
        out = _with_texts(msg, decoded, cut)
        over = tok(out) - max_tokens
        if over <= 0:
            break
    return out


# over the window, the tools list may take at most 1/4 of the prompt budget
TOOLS_SHARE = 4


def _fit_tools(tools: list[dict], budget: int, tok: Any) -> tuple[list[dict], int]:
    """``tools`` within ``budget`` tokens: each tool keeps its first ``k`` argument names (the largest ``k``
    that fits, found by bisection; the schemas' values are untyped, the names what the agent used), and
    when even names-free schemas are too many, the first tools that fit. Each trimmed tool says in its
    description how many names it lost. Returns (tools, how many names and tools were dropped)."""

    def props(t: dict) -> dict:
        params = (t.get("function") or {}).get("parameters") if isinstance(t, dict) else None
        p = params.get("properties") if isinstance(params, dict) else None
        return p if isinstance(p, dict) else {}

    def capped(k: int, n_tools: int) -> list[dict]:
        out = []
        for t in tools[:n_tools]:
            p = props(t)
            if len(p) <= k:
                out.append(t)
                continue
            fn = t["function"]
            note = f" ({len(p) - k} more argument names omitted to fit the teacher's context window)"
            params = {**fn["parameters"], "properties": dict(list(p.items())[:k])}
            out.append(
                {**t, "function": {**fn, "description": str(fn.get("description") or "") + note, "parameters": params}}
            )
        return out

    widest = max(len(props(t)) for t in tools)
    lo, hi = 0, widest  # the largest k whose schemas fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if tok(capped(mid, len(tools))) <= budget else (lo, mid - 1)
    n = len(tools)
    # too many tools even without argument names: the first ones that fit
    if tok(capped(lo, n)) > budget:
        a, b = 0, n
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if tok(capped(0, mid)) <= budget else (a, mid - 1)
        n = a
    out = capped(lo, n)
    dropped = sum(max(0, len(props(t)) - lo) for t in tools[:n]) + (len(tools) - n)
    return out, dropped


def fit_messages(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_prompt_tokens: int,
    *,
    bytes_per_token: float = FIT_BYTES_PER_TOKEN,
    step: int = 1,
    count: Any = None,
    scale: float = 1.0,
    sizes: JsonSizes | None = None,
    key: Any = None,
) -> Fitted:
    """Fit a rendered prefix into ``max_prompt_tokens`` (the window minus the answer's ``max_tokens``).

    Keeps the system prompt and the session's first user message, then as many of the most recent turns
    as fit; the elided middle becomes ONE user message saying how many messages were elided. An assistant
    message with tool calls and its tool results are kept or elided together (every call stays answered
    exactly once). A single message too large even alone (a huge tool result, or a tool call's huge
    arguments) is cut in its middle. A tools list larger than 1/4 of the budget loses argument names (then
    tools) until it fits. What still does not fit (one turn of hundreds of answered parallel calls) comes
    back with ``fits`` False. With
    ``step`` > 1 the number of elided units is a multiple of ``step``: consecutive states of a stream then
    share the same elision point (the same prefix) for several steps, so a provider's prompt cache still
    hits behind the marker; the price is keeping up to ``step`` − 1 fewer turns than would fit.
    Counts with ``count`` (a tokenizer's count of a message, teachers/token_count.py) times ``scale``
    when given, else :func:`count_tokens` (conservative bytes-per-token ratio). ``sizes`` measures each
    message object once across calls, and with a ``key`` (a teacher's stream) keeps the running token
    sums and turn boundaries of the last list fitted under it: the next state's list, extending it, adds
    only its new messages, and the elision point is found by bisection, so fitting a state costs its new
    messages and what it keeps, not its whole prefix."""
    bpt = bytes_per_token

    def tok(obj: Any) -> int:
        if count is None:
            return count_tokens(obj, bpt, sizes(obj) if sizes is not None else None)
        # the tokenizer's count, scaled up for a refit
        return int(-(-count(obj) * scale // 1))

    pre = _Prefix() if sizes is None or key is None else sizes.prefix((key, bpt, scale, count))
    pre.extend(messages, tok)
    # cum[i]: tokens of messages[:i]; starts: where each turn begins
    cum, starts = pre.cum, pre.starts
    tools_cost = tok(tools) if tools else 0
    total = FIT_TOKENS_FIXED + tools_cost + cum[len(messages)]
    if total <= max_prompt_tokens:
        return Fitted(list(messages), tokens=total, tools=tools)
    cut = 0
    if tools and tools_cost > max_prompt_tokens // TOOLS_SHARE:
        tools, dropped = _fit_tools(tools, max_prompt_tokens // TOOLS_SHARE, tok)
        tools_cost = tok(tools) if tools else 0
        cut += bool(dropped)
    fixed = FIT_TOKENS_FIXED + tools_cost
    # head: system prompt(s) + the first user message
    h = _head_end(messages)
    head = list(messages[:h])
    # an oversized first message gets at most half
    head_budget = max(MIN_TURN_TOKENS, (max_prompt_tokens - fixed) // 2)
    if h and cum[h] > head_budget and messages[h - 1].get("role") == "user":  # an oversized first user message
        head[-1] = _cut_middle(head[-1], max(FIT_TOKENS_PER_MESSAGE + 16, head_budget - cum[h - 1]), bpt, tok)
        cut += 1
    head_cost = sum(tok(m) for m in head)
    # the turns after the head: starts[first:] (a head message never holds tool calls, so the turns of the
    # whole list from h on are the turns of messages[h:])
    first = bisect.bisect_left(starts, h)
    n_units = len(starts) - first
    marker_cost = tok({"role": "user", "content": ELIDED_MARKER.format(n=10**9)})
    room = max_prompt_tokens - fixed - head_cost
    end = cum[len(messages)]

    # keeping the turns from the k-th on does not fit (monotone in k >= 1)
    def over(k: int) -> bool:
        return end - cum[starts[first + k]] + (marker_cost if k else 0) > room

    k = _turns_to_elide(n_units, max(1, int(step)), over) if n_units and over(0) else 0
    # keep at least the last turn (cut below when even it is too large)
    k = min(k, max(n_units - 1, 0))
    keep_from = starts[first + k] if n_units else len(messages)
    elided = keep_from - h
    out = head + ([{"role": "user", "content": ELIDED_MARKER.format(n=elided)}] if elided else [])
    tail = messages[keep_from:]
    used = fixed + sum(tok(m) for m in out)
    tail_costs = [cum[i + 1] - cum[i] for i in range(keep_from, len(messages))]
    if used + sum(tail_costs) > max_prompt_tokens and tail:
        cut += _cut_kept_turn(tail, tail_costs, max_prompt_tokens - used, bpt, tok)
    out += tail
    tokens = used + sum(tail_costs)
    return Fitted(out, elided, cut, tokens, tools, tokens <= max_prompt_tokens)


def _head_end(messages: list[dict[str, Any]]) -> int:
    """How many messages the head holds: the leading system prompt(s), then the first user message."""
    h = 0
    while h < len(messages) and messages[h].get("role") == "system":
        h += 1
    if h < len(messages) and messages[h].get("role") == "user":
        h += 1
    return h


def _turns_to_elide(n_units: int, step: int, over: Any) -> int:
    """The fewest turns to elide, a multiple of ``step``, so that the rest fits (``over(k)``: keeping the
    turns from the k-th on does not fit, monotone in k >= 1); called when keeping all of them does not."""
    # the first multiple of step that fits, else hi
    lo, hi = 1, (n_units - 1) // step + 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if not over(mid * step) else (mid + 1, hi)
    k = lo * step
    # a step overshot the last turn (the window holds fewer than `step` turns): single steps
    if k >= n_units:
        k = max(0, k - step)
        while k < n_units - 1 and over(k):
            k += 1
    return k


def _cut_kept_turn(tail: list[dict], tail_costs: list[int], room: int, bpt: float, tok: Any) -> int:
    """The kept turn is itself larger than ``room``: cut its largest texts (contents, tool-call arguments)
    in the middle, biggest message first, in place; returns how many messages were cut."""
    cut = 0
    for i in sorted(range(len(tail)), key=lambda i: -tail_costs[i]):
        excess = sum(tail_costs) - room
        if excess <= 0:
            break
        new = _cut_middle(tail[i], max(FIT_TOKENS_PER_MESSAGE + 16, tail_costs[i] - excess), bpt, tok)
        if new is not tail[i]:
            tail[i], tail_costs[i] = new, tok(new)
            cut += 1
    return cut


class _Prefix:
    """Running token sums and turn starts of a message list, extended in place when the next list holds the
    same message objects first. A turn: an assistant message with tool calls and the tool results after it
    (kept or elided together), or any other single message."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.cum: list[int] = [0]
        self.starts: list[int] = []

    def extend(self, messages: list[dict], tok: Any) -> None:
        if len(messages) < len(self.items) or not all(map(operator.is_, self.items, messages)):
            self.items, self.cum, self.starts = [], [0], []
        for i in range(len(self.items), len(messages)):
            m = messages[i]
            self.cum.append(self.cum[-1] + tok(m))
            if not (m.get("role") == "tool" and self.starts and messages[self.starts[-1]].get("tool_calls")):
                self.starts.append(i)
        self.items = list(messages)
