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

Every rendered prefix is scrubbed once more as the JSON it is sent as (:func:`_scrubbed`), after a
secret split across two blocks of a message (or two tool arguments) is redacted in both halves
(:func:`_seams_scrubbed`).

Deliberately simplified: the real Claude Code system prompt and tool descriptions are not in the
traces; ``system_prompt`` is a recipe option and tool schemas are inferred from usage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import orjson
import pyarrow as pa

from composer_pipeline import codex_items, settings
from composer_pipeline.actions import Action
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

    def __post_init__(self) -> None:
        if self.compaction not in ("after", "full"):
            raise ValueError(f"render.compaction must be 'after' or 'full', not {self.compaction!r}")

    @classmethod
    def from_recipe(cls, recipe: str | Path | dict | None) -> "RenderOptions":
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
            if not (type(tid) is str and tid in known_tool_uses):  # (known ids are strings; an odd id may not hash)
                parts.append(f"[tool result for a call not in this transcript]\n{flatten_content(b.get('content'))}")
        else:
            parts.append(f"[{t}]")
    return parts


def action_from_blocks(blocks: list[dict]) -> Action:
    from composer_pipeline.actions import ToolCall

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


class Conversation:
    """``trace_messages`` rows indexed by stream and uuid (one or many sessions)."""

    def __init__(self) -> None:
        self.streams: dict[str, _Stream] = {}

    @classmethod
    def from_table(cls, trace_messages: pa.Table) -> "Conversation":
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
            s.groups.setdefault(row.get("message_key") or u, []).append(row)
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


def prefix_path(s: _Stream, leaf: str | None, compaction: str) -> tuple[list[dict], bool]:
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
    return msg, [(c.id, c.name) for c in action.tool_calls]


def render_state(conv: Conversation, state: dict, opts: RenderOptions | None = None) -> RenderedState:
    opts = opts or RenderOptions()
    sid = state["stream_id"]
    s = conv.streams.get(sid)
    messages: list[dict] = [{"role": "system", "content": opts.system_prompt}]
    if s is None:
        return RenderedState(messages, [])
    own_key = state.get("message_id") or state.get("request_id") or (state.get("record_uuids") or [None])[0]
    src = state.get("source_lines") or []
    first_line = min(src) if src else None
    path, crossed = prefix_path(s, state.get("prefix_leaf_uuid"), opts.compaction)
    emitted: set[str] = set()
    for row in path:
        rt = row["record_type"]
        if rt == "assistant":
            key = row.get("message_key") or row["uuid"]
            if key in emitted or key == own_key:
                continue
            group = s.groups.get(key, [row])
            if any(_is_synthetic_row(r) for r in group):
                continue
            emitted.add(key)
            msg, calls = _assistant_message(group, opts.strip_thinking)
            messages.append(msg)
            for call_id, _name in calls:
                res = s.results.get(call_id)
                seen_before = res is not None and (first_line is None or (res[0]["line_no"] or 0) < first_line)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": flatten_content(res[1].get("content")) if seen_before else INTERRUPTED,
                    }
                )
        elif rt == "user":
            if row.get("is_meta") or (crossed and row.get("is_compact_summary")):
                continue
            parts = _egress().scrub_seams(user_parts(row["_content"], s.tool_uses))
            if parts:
                messages.append({"role": "user", "content": "\n\n".join(parts)})
    return _scrubbed(RenderedState(messages, conv.tool_schemas(sid)))


_EGRESS = None  # the built-in secret patterns, for _scrubbed


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


def _scrubbed(rs: RenderedState) -> RenderedState:
    """The prefix scrubbed once more, in the form it leaves the machine in (defense in depth).

    Ingest already scrubbed the raw lines (escape-aware, scrub.py). Here the decoded text is
    re-encoded by orjson (which escapes no ASCII letter), so a key that a writer had spelled with
    escapes (``s\\u006b-...``), invisible in the raw line, is visible and caught. One Hyperscan pass
    over the JSON; the exact patterns run only on the rare candidate lines (one line here)."""
    data = orjson.dumps([rs.messages, rs.tools])
    clean = _egress().scrub_bytes(data)
    if clean is data or clean == data:
        return rs
    messages, tools = orjson.loads(clean)
    return RenderedState(messages, tools)


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
FIT_TOKENS_PER_MESSAGE = 8  # role markers and separators of chat templates
FIT_TOKENS_FIXED = 32  # generation prompt, tool-list framing
MIN_TURN_TOKENS = 256  # a window must hold the system prompt plus at least this much of one turn
ELIDED_MARKER = "[{n} earlier messages elided to fit the teacher's context window]"
CUT_MARKER = "\n[... {n} characters cut to fit the teacher's context window ...]\n"


def count_tokens(obj: Any, bytes_per_token: float = FIT_BYTES_PER_TOKEN) -> int:
    """Tokens of one message (or the tools list) as sent: its JSON bytes / ``bytes_per_token``, rounded up."""
    n = len(orjson.dumps(obj))
    return -(-n * 1000 // int(bytes_per_token * 1000)) + FIT_TOKENS_PER_MESSAGE


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
    """A prefix fitted into a token budget: the messages to send and what was done to them."""

    messages: list[dict[str, Any]]
    elided: int = 0  # messages replaced by the marker (the marker itself not counted)
    cut: int = 0  # messages whose content was cut in its middle
    tokens: int = 0  # estimated prompt tokens of the result (tools included)

    @property
    def changed(self) -> bool:
        return bool(self.elided or self.cut)


def _units(messages: list[dict]) -> list[list[int]]:
    """Indices grouped so that an assistant message with tool calls stays with the tool results after it."""
    units: list[list[int]] = []
    for i, m in enumerate(messages):
        if m.get("role") == "tool" and units and messages[units[-1][0]].get("tool_calls"):
            units[-1].append(i)
        else:
            units.append([i])
    return units


def _cut_middle(msg: dict, max_tokens: int, bpt: float, tok: Any) -> dict:
    """``msg`` with its text content cut in the middle so that the message counts (``tok``) at most ``max_tokens``."""
    content = msg.get("content")
    if not isinstance(content, str):
        return msg
    over = tok(msg) - max_tokens
    if over <= 0:
        return msg
    # bytes to drop: the overrun at the ratio, plus the marker; characters ≥ bytes/4 (UTF-8), so drop by
    # characters conservatively and re-check
    drop = int(over * bpt) + len(CUT_MARKER) + 16
    while True:
        keep = max(0, len(content) - drop)
        head, tail = content[: keep // 2], content[len(content) - (keep - keep // 2) :] if keep else ""
        out = {**msg, "content": head + CUT_MARKER.format(n=len(content) - keep) + tail}
        if tok(out) <= max_tokens or keep == 0:
            return out
        drop += max(64, drop // 4)


def fit_messages(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_prompt_tokens: int,
    *,
    bytes_per_token: float = FIT_BYTES_PER_TOKEN,
    step: int = 1,
    count: Any = None,
    scale: float = 1.0,
) -> Fitted:
    """Fit a rendered prefix into ``max_prompt_tokens`` (the window minus the answer's ``max_tokens``).

    Keeps the system prompt and the session's first user message, then as many of the most recent turns
    as fit; the elided middle becomes ONE user message saying how many messages were elided. An assistant
    message with tool calls and its tool results are kept or elided together (every call stays answered
    exactly once). A single message too large even alone (a huge tool result) is cut in its middle. With
    ``step`` > 1 the number of elided units is a multiple of ``step``: consecutive states of a stream then
    share the same elision point (the same prefix) for several steps, so a provider's prompt cache still
    hits behind the marker; the price is keeping up to ``step`` − 1 fewer turns than would fit.
    Counts with ``count`` (a tokenizer's count of a message, teachers/token_count.py) times ``scale``
    when given, else :func:`count_tokens` (conservative bytes-per-token ratio)."""
    bpt = bytes_per_token

    def tok(obj: Any) -> int:
        if count is None:
            return count_tokens(obj, bpt)
        return int(-(-count(obj) * scale // 1))  # the tokenizer's count, scaled up for a refit

    fixed = FIT_TOKENS_FIXED + (tok(tools) if tools else 0)
    costs = [tok(m) for m in messages]
    total = fixed + sum(costs)
    if total <= max_prompt_tokens:
        return Fitted(list(messages), tokens=total)
    # head: system prompt(s) + the first user message
    h = 0
    while h < len(messages) and messages[h].get("role") == "system":
        h += 1
    if h < len(messages) and messages[h].get("role") == "user":
        h += 1
    head = list(messages[:h])
    cut = 0
    head_budget = max(MIN_TURN_TOKENS, (max_prompt_tokens - fixed) // 2)  # an oversized first message gets at most half
    if h and sum(costs[:h]) > head_budget and messages[h - 1].get("role") == "user":  # an oversized first user message
        others = sum(costs[: h - 1])
        head[-1] = _cut_middle(head[-1], max(FIT_TOKENS_PER_MESSAGE + 16, head_budget - others), bpt, tok)
        cut += 1
    head_cost = sum(tok(m) for m in head)
    rest = messages[h:]
    units = _units(rest)
    ucost = [sum(costs[h + i] for i in u) for u in units]
    marker_cost = tok({"role": "user", "content": ELIDED_MARKER.format(n=10**9)})
    room = max_prompt_tokens - fixed - head_cost
    # suffix sums: keeping units[k:] costs suffix[k]
    suffix = [0] * (len(units) + 1)
    for k in range(len(units) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + ucost[k]
    step = max(1, int(step))

    def over(k: int) -> bool:
        return suffix[k] + (marker_cost if k else 0) > room

    k = 0
    while k < len(units) and over(k):
        k += step
    if k >= len(units):  # a step overshot the last turn (the window holds fewer than `step` turns): single steps
        k = max(0, k - step)
        while k < len(units) - 1 and over(k):
            k += 1
    k = min(k, max(len(units) - 1, 0))  # keep at least the last turn (cut below when even it is too large)
    kept_idx = [i for u in units[k:] for i in u]
    elided = sum(len(u) for u in units[:k])
    out = head + ([{"role": "user", "content": ELIDED_MARKER.format(n=elided)}] if elided else [])
    tail = [rest[i] for i in kept_idx]
    used = fixed + sum(tok(m) for m in out)
    tail_cost = sum(tok(m) for m in tail)
    if used + tail_cost > max_prompt_tokens and tail:
        # the kept turn is itself too large: cut its largest text contents in the middle, biggest first
        order = sorted(range(len(tail)), key=lambda i: -tok(tail[i]))
        for i in order:
            over = used + sum(tok(m) for m in tail) - max_prompt_tokens
            if over <= 0:
                break
            if not isinstance(tail[i].get("content"), str):
                continue
            tail[i] = _cut_middle(tail[i], max(FIT_TOKENS_PER_MESSAGE + 16, tok(tail[i]) - over), bpt, tok)
            cut += 1
    out += tail
    return Fitted(out, elided, cut, fixed + sum(tok(m) for m in out))
