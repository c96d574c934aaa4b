"""The one shape of an agent step: an :class:`Action` (text, thinking, tool calls).

The agent's own action (parsed from a trace), each teacher's answer and each trained-model
completion all become an ``Action``, so pairing, rewards and display compare like with like.

Text form (used as the DPO/GRPO completion string and to parse plain-text model output):
free text, then one ``<tool_call>`` block per call (the Hermes/Qwen2.5 tool-call convention, which
small open chat models are trained on), its body compact JSON in one of two key orders
(:data:`ACTION_ORDERS`, the ``render.action_order`` setting):

* ``sorted`` (the default): ``{"arguments":{...},"name":"Read"}``, every key sorted;
* ``name_first``: ``{"name":"Read","arguments":{...}}``, the decision first, as the Hermes/Qwen
  template itself writes it (the arguments' own keys still sorted).

Parsing accepts either order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

ActionOrder = Literal["sorted", "name_first"]
ACTION_ORDERS: tuple[ActionOrder, ...] = ("sorted", "name_first")

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Action:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    thinking: str = ""

    # -- (de)serialisation: the JSON stored in Parquet ``action``/``chosen``/``rejected`` columns
    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "thinking": self.thinking,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
        }

    def to_json(self) -> str:
        return orjson.dumps(self.to_dict()).decode()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Action:
        calls = tuple(
            ToolCall(name=c["name"], arguments=dict(c.get("arguments") or {}), id=c.get("id", ""))
            for c in d.get("tool_calls") or ()
        )
        return cls(text=d.get("text") or "", tool_calls=calls, thinking=d.get("thinking") or "")

    @classmethod
    def from_json(cls, s: str | bytes) -> Action:
        return cls.from_dict(orjson.loads(s))

    @property
    def is_empty(self) -> bool:
        return not self.text.strip() and not self.tool_calls

    # -- text form
    def to_text(self, order: ActionOrder = "sorted") -> str:
        """Completion string: text, then one ``<tool_call>`` block per call (no thinking), each call's
        JSON in ``order`` (:func:`tool_call_json`)."""
        parts = [self.text.strip()] if self.text.strip() else []
        for c in self.tool_calls:
            parts.append(f"<tool_call>\n{tool_call_json(c.name, c.arguments, order)}\n</tool_call>")
        return "\n".join(parts)

    def to_chat_message(self) -> dict[str, Any]:
        """OpenAI chat-format assistant message (``tool_calls`` with JSON-string arguments)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()},
                }
                for c in self.tool_calls
            ]
        return msg


def tool_call_json(name: str, arguments: Any, order: ActionOrder = "sorted") -> str:
    """The compact JSON body of one ``<tool_call>`` block: the one serializer of a call's text form.
    ``sorted``: every key sorted, so the name comes after the arguments; ``name_first``: the name,
    then the arguments (their own keys sorted)."""
    if order == "sorted":
        return orjson.dumps({"name": name, "arguments": arguments}, option=orjson.OPT_SORT_KEYS).decode()
    if order == "name_first":
        args = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
        return f'{{"name":{orjson.dumps(name).decode()},"arguments":{args}}}'
    raise ValueError(f"action order must be one of {ACTION_ORDERS}, not {order!r}")


class ActionParseError(ValueError):
    """A model answer that cannot be read as an action; the message says why and ``reason`` names the
    kind of failure (one of :data:`PARSE_REASONS`), so failures can be counted by reason."""

    def __init__(self, message: str, reason: str = "other"):
        super().__init__(message)
        self.reason = reason


# the kinds of unparseable answers (ActionParseError.reason)
PARSE_REASONS = ("invalid_json", "no_name", "arguments_not_object", "unterminated", "empty", "other")


def parse_failure(text: str) -> str | None:
    """Why ``text`` is not a valid action (a :data:`PARSE_REASONS` key), or None when it parses as one.
    An empty answer (nothing but whitespace) is not an action either: ``empty``."""
    if not text.strip():
        return "empty"
    try:
        parse_action_text(text)
    except ActionParseError as e:
        return e.reason
    return None


def parse_action_text(text: str) -> Action:
    """Parse the text form back into an :class:`Action`.

    Raises :class:`ActionParseError` for a ``<tool_call>`` block whose body is not a JSON
    object with a string ``name`` (an answer that *tried* to call a tool and failed).
    """
    calls: list[ToolCall] = []
    for i, m in enumerate(TOOL_CALL_RE.finditer(text)):
        try:
            body = orjson.loads(m.group(1))
        except orjson.JSONDecodeError as e:
            raise ActionParseError(f"tool_call {i} is not valid JSON: {e}", "invalid_json") from None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ActionParseError(f"tool_call {i} has no string 'name'", "no_name")
        args = body.get("arguments", {})
        if isinstance(args, str):
            try:
                args = orjson.loads(args)
            except orjson.JSONDecodeError:
                raise ActionParseError(
                    f"tool_call {i} arguments are a non-JSON string", "arguments_not_object"
                ) from None
        if not isinstance(args, dict):
            raise ActionParseError(f"tool_call {i} arguments are not an object", "arguments_not_object")
        calls.append(ToolCall(name=body["name"], arguments=args, id=f"call_{i}"))
    if "<tool_call>" in text and len(calls) != text.count("<tool_call>"):
        raise ActionParseError("unterminated <tool_call> block", "unterminated")
    free = TOOL_CALL_RE.sub("", text).strip()
    return Action(text=free, tool_calls=tuple(calls))


def parse_chat_message(message: dict[str, Any]) -> Action:
    """Parse an OpenAI chat-completions ``choices[0].message`` into an :class:`Action`.

    Native ``tool_calls`` win; otherwise ``<tool_call>`` blocks in the content are parsed.
    Raises :class:`ActionParseError` with the reason when neither reading works.
    """
    if not isinstance(message, dict):
        raise ActionParseError("message is not an object")
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise ActionParseError("content is neither a string nor a list of parts")
    thinking = message.get("reasoning_content") or message.get("reasoning") or ""
    native = message.get("tool_calls") or []
    if native:
        calls = []
        for i, c in enumerate(native):
            fn = (c or {}).get("function") or {}
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise ActionParseError(f"tool_calls[{i}] has no function name")
            raw = fn.get("arguments") or "{}"
            try:
                args = orjson.loads(raw) if isinstance(raw, str) else raw
            except orjson.JSONDecodeError:
                raise ActionParseError(f"tool_calls[{i}] arguments are not valid JSON") from None
            if not isinstance(args, dict):
                raise ActionParseError(f"tool_calls[{i}] arguments are not an object")
            calls.append(ToolCall(name=name, arguments=args, id=c.get("id") or f"call_{i}"))
        return Action(text=TOOL_CALL_RE.sub("", content).strip(), tool_calls=tuple(calls), thinking=thinking)
    action = parse_action_text(content)
    return Action(text=action.text, tool_calls=action.tool_calls, thinking=thinking)
