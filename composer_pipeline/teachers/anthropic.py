"""The native Anthropic Messages API as a teacher protocol (``api: anthropic``): request and answer mapping.

In:  the request body replay builds and hashes (OpenAI chat shape: ``model``, ``messages``, ``tools``,
     sampling params), an answer of ``POST /v1/messages``.
Out: :func:`to_messages_request`: the Messages API body: ``system`` as text blocks, ``tools`` as
     ``{name, description, input_schema}``, assistant tool calls as ``tool_use`` blocks and tool results as
     ``tool_result`` blocks (with ``is_error`` when the tool failed) in the user turn after them (consecutive turns of one role merged: the API
     wants user/assistant alternation), and ``cache_control`` breakpoints (:func:`place_breakpoints`);
     :func:`to_chat_completion`: the answer as an OpenAI-shaped completion (``tool_use`` blocks →
     ``tool_calls``), so the same parser turns it into the :class:`~composer_pipeline.actions.Action`
     whose signature consensus compares, and its usage mapped so that :func:`pricing.billed` settles
     cache reads and writes at their prices.

Facts (docs.anthropic.com, "Messages" and "Prompt caching"): headers ``x-api-key`` and
``anthropic-version``; ``max_tokens`` required; at most 4 ``cache_control`` breakpoints per request;
the cached prefix is tools → system → messages; at each breakpoint the API looks for a cached prefix
ending at a block boundary up to about 20 blocks before it; ``input_tokens`` counts only the tokens
after the last breakpoint, the prompt is ``input_tokens + cache_creation_input_tokens +
cache_read_input_tokens``; ``seed`` does not exist there (not sent).

Deliberately simplified: images in the prefix are already text placeholders (render.py); no streaming;
no extended thinking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

# per request (docs.anthropic.com prompt caching)
MAX_BREAKPOINTS = 4
# how far back from a breakpoint a cached prefix is looked for
LOOKBACK_BLOCKS = 20
_TOOL_ID_RE = re.compile(r"[^a-zA-Z0-9_-]")
EMPTY_TEXT = "[no text]"


def _tool_id(raw: Any, n: int) -> str:
    s = _TOOL_ID_RE.sub("_", str(raw or ""))
    return s or f"call_{n}"


def _text_block(text: Any) -> dict[str, Any]:
    t = text if isinstance(text, str) else orjson.dumps(text).decode()
    return {"type": "text", "text": t if t.strip() else EMPTY_TEXT}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            v = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"input": raw}
        return v if isinstance(v, dict) else {"input": v}
    return {}


# the shortest prefix each model family caches (shorter ones are silently not cached), docs.anthropic.com prompt
# caching, Nov 2026: Haiku 4.5 and Opus 4.5/4.6 4,096 tokens; Sonnet 4.6 and Opus 4.7 2,048; the others 1,024
_MIN_CACHED = (
    (re.compile(r"haiku-4[-.]5|opus-4[-.][56]"), 4096),
    (re.compile(r"sonnet-4[-.]6|opus-4[-.]7"), 2048),
)
MIN_CACHED_DEFAULT = 1024


def min_cached_tokens(model: str) -> int:
    """The minimum cacheable prefix of a Claude ``model`` (an id such as ``claude-haiku-4-5-20251001``)."""
    m = model.lower()
    return next((n for pattern, n in _MIN_CACHED if pattern.search(m)), MIN_CACHED_DEFAULT)


@dataclass(frozen=True)
class CacheHint:
    """What replay knows about a request's stream (session-affine scheduling): the previous request of the
    stream had ``read_through`` messages and this request extends it (None: unknown or not a prefix), and
    whether a later request of the stream will read what this one writes (``write``)."""

    read_through: int | None = None
    write: bool = True


def convert_messages(
    messages: list[dict[str, Any]], ends: list[dict[str, Any] | None] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, alternating user/assistant messages with content blocks) from OpenAI chat messages.
    Every tool_use keeps its id and is answered by the tool_result of the same id (render.py answers each
    call exactly once). ``ends``, when given, receives per input message the last block it became."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    ids: dict[str, str] = {}
    n = 0

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role = m.get("role")
        if ends is not None:
            ends.append(None)
        if role == "system":
            system.append(_text_block(m.get("content") or ""))
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if isinstance(m.get("content"), str) and m["content"].strip():
                blocks.append({"type": "text", "text": m["content"]})
            for call in m.get("tool_calls") or []:
                n += 1
                fn = call.get("function") or {}
                tid = ids.setdefault(str(call.get("id")), _tool_id(call.get("id"), n))
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": tid,
                        "name": str(fn.get("name") or ""),
                        "input": _arguments(fn.get("arguments")),
                    }
                )
            add("assistant", blocks or [_text_block("")])
        elif role == "tool":
            n += 1
            tid = ids.get(str(m.get("tool_call_id")), _tool_id(m.get("tool_call_id"), n))
            content = m.get("content")
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": tid,
                "content": content if isinstance(content, str) and content else EMPTY_TEXT,
            }
            if m.get("is_error") is True:
                block["is_error"] = True
            add("user", [block])
        else:  # user
            add("user", [_text_block(m.get("content") or "")])
        if ends is not None:
            ends[-1] = (system[-1] if role == "system" else out[-1]["content"][-1]) if (system or out) else None
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [_text_block("[session start]")]})
    # a trailing assistant turn would be a prefill: ask for the next step
    if out[-1]["role"] == "assistant":
        out.append({"role": "user", "content": [_text_block("Continue with the next step.")]})
    return system, out


def place_breakpoints(
    system: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    limit: int = MAX_BREAKPOINTS,
    read_at: dict[str, Any] | None = None,
    write: bool = True,
) -> int:
    """Mark ``cache_control`` breakpoints in place; returns how many (≤ ``limit``).

    The last block of the request: writes the whole prefix for the next state of the stream, whose request
    extends this one (and reads what the previous state wrote, when it ended within the lookback). Then
    one breakpoint every ``LOOKBACK_BLOCKS − 2`` blocks before it, so a previous state that ended further
    back than one lookback is still found; the last one on the system prompt (tools + system, the part
    every stream of a recipe shares).

    With a hint from replay: ``read_at`` (the block where the previous request of the stream ended, which
    that request wrote) gets a breakpoint of its own, so the read never depends on the lookback; with
    ``write`` false (the last request of its stream: nobody reads after it) only that breakpoint is
    placed, so nothing is written at the 1.25× write price for no later read."""
    blocks = [b for m in messages for b in m["content"]]
    marks: list[dict[str, Any]] = []
    if read_at is not None:
        marks.append(read_at)
    if not write:
        for b in marks:
            b["cache_control"] = {"type": "ephemeral"}
        return len(marks)
    if blocks:
        i = len(blocks) - 1
        while i >= 0 and len(marks) < limit - (1 if system else 0):
            if not any(b is blocks[i] for b in marks):
                marks.append(blocks[i])
            i -= LOOKBACK_BLOCKS - 2
    if system and len(marks) < limit and not any(b is system[-1] for b in marks):
        marks.append(system[-1])
    for b in marks:
        b["cache_control"] = {"type": "ephemeral"}
    return len(marks)


def to_messages_request(body: dict[str, Any], *, cache: bool = True, hint: CacheHint | None = None) -> dict[str, Any]:
    """The Messages API body for a replay request body (see the module docstring)."""
    ends: list[dict[str, Any] | None] = []
    system, messages = convert_messages(body.get("messages") or [], ends)
    if cache:
        hint = hint or CacheHint()
        read_at = ends[hint.read_through - 1] if hint.read_through and 0 < hint.read_through <= len(ends) else None
        place_breakpoints(system, messages, read_at=read_at, write=hint.write)
    out: dict[str, Any] = {
        "model": body["model"],
        "max_tokens": int(body.get("max_tokens") or 512),
        "messages": messages,
    }
    if system:
        out["system"] = system
    tools = [t.get("function") or {} for t in body.get("tools") or []]
    if tools:
        out["tools"] = [
            {
                "name": f.get("name"),
                "description": f.get("description") or f"The {f.get('name')} tool.",
                "input_schema": f.get("parameters") or {"type": "object", "properties": {}},
            }
            for f in tools
        ]
    for k in ("temperature", "top_p"):
        if body.get(k) is not None:
            out[k] = body[k]
    return out


def message_problem(data: Any) -> str | None:
    """None when ``data`` is a usable Messages API answer, else what is wrong with it."""
    if not isinstance(data, dict):
        return "body is not a JSON object"
    if data.get("type") == "error" or "error" in data and "content" not in data:
        return f"error: {str(data.get('error'))[:200]}"
    if not isinstance(data.get("content"), list):
        return "content blocks missing"
    return None


def to_chat_completion(data: dict[str, Any]) -> dict[str, Any]:
    """A Messages API answer as an OpenAI-shaped chat completion (text, ``tool_calls``, usage with cache fields)."""
    texts, calls = [], []
    for b in data.get("content") or []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text":
            texts.append(str(b.get("text") or ""))
        elif b.get("type") == "tool_use":
            calls.append(
                {
                    "id": str(b.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(b.get("name") or ""),
                        "arguments": orjson.dumps(b.get("input") or {}).decode(),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    out: dict[str, Any] = {
        "id": data.get("id"),
        "object": "chat.completion",
        "model": data.get("model"),
        "choices": [{"index": 0, "finish_reason": data.get("stop_reason"), "message": message}],
    }
    if "usage" in data:
        out["usage"] = _chat_usage(data["usage"])
    if data.get("stop_reason") == "refusal":
        message["refusal"] = message["content"] or "[refused without text]"
    return out


def _chat_usage(u: Any) -> Any:
    """A native usage in the OpenAI shape, its native fields kept; as received when any count is not a
    non-negative integer (a negative ``input_tokens`` must not vanish in the sum: pricing.settle flags it)."""
    if not isinstance(u, dict):
        return u
    inp, read, write = (
        u.get(k) or 0 for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    counts = (inp, read, write, u.get("output_tokens"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        return u
    return {
        **u,
        "prompt_tokens": inp + read + write,
        "completion_tokens": u["output_tokens"],
        "total_tokens": inp + read + write + u["output_tokens"],
        "prompt_tokens_details": {"cached_tokens": read},
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
        "input_tokens": inp,
    }
