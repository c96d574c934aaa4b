"""The one walk over a view that both formatters read: each prefix message as a :class:`Turn` (who,
which call it answers, its text shortened), and the lines of an action or a teacher's answer.

In:  a view's ``prefix`` (OpenAI chat messages, as replay sends them) and actions (``Action.to_dict()``);
     ``full`` (nothing shortened) or the terminal's limits (:data:`LIMITS`).
Out: :func:`walk` -> one :class:`Turn` per message; :func:`action_lines`, :func:`call_text`,
     :func:`teacher_summary`, :func:`teacher_flags` and the number formats both views print.
     :mod:`.text` lays the turns out for a terminal, :mod:`.markdown` in Markdown: what is shown, and
     how it is shortened, is decided here once.

Deliberately simplified: a message's content is flattened to text (:func:`render.flatten_content`);
images and other non-text blocks show as their placeholder text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from composer_pipeline.render import INTERRUPTED, flatten_content

if TYPE_CHECKING:
    from composer_pipeline.show.views import TeacherAnswer


@dataclass(frozen=True)
class Limits:
    """How much of each thing is shown: characters per argument value, lines per tool result / text."""

    value_chars: int = 160
    tool_lines: int = 6
    text_lines: int = 12
    system_lines: int = 3


LIMITS = Limits()
FULL = Limits(0, 0, 0, 0)  # 0 = nothing shortened


def limits(full: bool) -> Limits:
    return FULL if full else LIMITS


@dataclass
class Turn:
    """One prefix message as both views show it.

    ``body``: the shortened text (tool result, user or system message); ``lines``: an assistant's
    shortened text lines, then one ``→ Name(args)   [id]`` line per tool call."""

    index: int  # 1-based position in the prefix
    role: str | None
    body: str = ""
    lines: list[str] = field(default_factory=list)
    # a tool message: the name of the call it answers
    tool_name: str = "?"
    tool_call_id: str | None = None
    # a tool message: no result before this step
    interrupted: bool = False


def walk(prefix: Sequence[dict], full: bool = False, last: int | None = None) -> list[Turn]:
    """The prefix as turns; ``last`` keeps only the last N messages (their indexes unchanged)."""
    lim = limits(full)
    names = tool_names(prefix)
    msgs = list(enumerate(prefix, 1))
    if last is not None and len(msgs) > last:
        msgs = msgs[-last:]
    out = []
    for i, msg in msgs:
        role = msg.get("role")
        text = flatten_content(msg.get("content"))
        if role == "tool":
            tid = msg.get("tool_call_id")
            name = names.get(tid, "?") if isinstance(tid, str) else "?"
            turn = Turn(i, role, tool_name=name, tool_call_id=tid, interrupted=text == INTERRUPTED)
            if not turn.interrupted:
                turn.body = shorten(text, lim.tool_lines)
        elif role == "assistant":
            lines = shorten(text, lim.text_lines).splitlines() if text else []
            for c in msg.get("tool_calls") or []:
                fn = c.get("function") or {}
                lines.append(
                    f"→ {call_text(fn.get('name', '?'), fn.get('arguments'), lim.value_chars)}   [{c.get('id')}]"
                )
            turn = Turn(i, role, lines=lines)
        else:
            turn = Turn(i, role, body=shorten(text, lim.system_lines if role == "system" else lim.text_lines))
        out.append(turn)
    return out


def tool_names(prefix: Sequence[dict]) -> dict[str, str]:
    """tool_call_id -> the name of the function the assistant called."""
    return {
        c.get("id"): (c.get("function") or {}).get("name", "?")
        for m in prefix
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    }


def shorten(text: str, max_lines: int, max_chars: int = 240) -> str:
    """First ``max_lines`` lines (each cut at ``max_chars``) and how much was left out; 0 = everything."""
    if not max_lines:
        return text
    lines = text.splitlines() or [""]
    kept = [ln if len(ln) <= max_chars else ln[:max_chars] + "…" for ln in lines[:max_lines]]
    if len(lines) > max_lines:
        kept.append(f"… (+{len(lines) - max_lines} more lines, {len(text)} chars in all)")
    return "\n".join(kept)


def _value(v: Any, limit: int) -> str:
    s = orjson.dumps(v).decode()
    return s if not limit or len(s) <= limit else s[:limit] + f"…[{len(s)} chars]"


def call_text(name: str, arguments: Any, limit: int = 160) -> str:
    """``Name(key=value, ...)`` with JSON values, each cut at ``limit`` chars (0 = never)."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return f"{name}({_value(arguments, limit)})"
    if not isinstance(arguments, dict):
        return f"{name}({_value(arguments, limit)})"
    return f"{name}(" + ", ".join(f"{k}={_value(v, limit)}" for k, v in arguments.items()) + ")"


def action_lines(action: dict | None, limit: int, max_lines: int) -> list[str]:
    """An action (the agent's, a teacher's, a pair's side): thinking, text, then one line per tool call."""
    if not action:
        return ["(no action)"]
    out = []
    if action.get("thinking"):
        out += ["<thinking> " + ln for ln in shorten(action["thinking"], max_lines).splitlines()]
    if (action.get("text") or "").strip():
        out += shorten(action["text"].strip(), max_lines).splitlines()
    for c in action.get("tool_calls") or []:
        out.append(
            f"→ {call_text(c.get('name', '?'), c.get('arguments'), limit)}" + (f"   [{c['id']}]" if c.get("id") else "")
        )
    return out or ["(empty action)"]


def money(v: float | None) -> str:
    return "-" if v is None else f"${v:.6f}"


def secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def lines_span(lines: Sequence[int]) -> str:
    if not lines:
        return "?"
    lo, hi = min(lines), max(lines)
    return f"line {lo}" if lo == hi else f"lines {lo}-{hi}"


def teacher_flags(t: TeacherAnswer, agreeing: Sequence[str] = ()) -> str:
    flags = []
    if t.cache_hit:
        flags.append("cache hit")
    if t.teacher in agreeing:
        flags.append("agrees")
    if t.superseded:
        flags.append(f"{t.superseded} older row(s)")
    if t.sent_as_shown is True:
        flags.append("sent as shown ✓")
    elif t.sent_as_shown is False:
        flags.append("SENT A DIFFERENT PREFIX (other render options?)")
    return f"  [{', '.join(flags)}]" if flags else ""


def teacher_summary(ts: Sequence[TeacherAnswer]) -> str:
    by: dict[str, int] = {}
    for t in ts:
        by[t.status or "?"] = by.get(t.status or "?", 0) + 1
    cost = sum(t.cost_usd or 0.0 for t in ts)
    lat = [t.latency_s for t in ts if t.latency_s is not None and not t.cache_hit]
    s = ", ".join(f"{n} {k}" for k, n in sorted(by.items())) + f" · cost {money(cost)}"
    if lat:
        s += f" · latency mean {sum(lat) / len(lat):.2f} s, max {max(lat):.2f} s"
    return s
