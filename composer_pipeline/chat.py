"""Chat messages as plain text turns: what any ChatML-like template can render.

In:  OpenAI chat messages (``content`` a string or parts, assistant ``tool_calls``, ``tool`` messages)
     and the tool schemas. Out: ``{"role", "content": str}`` turns; tool calls written in the
     ``<tool_call>`` text form of :mod:`composer_pipeline.actions`, tool results as user turns, and the
     tool list described in the system turn. Used by the local teacher server (templates that cannot
     take ``tools``) and by the trainer (the policy's prompts), so both see the same text.
"""

from __future__ import annotations

from typing import Any

import orjson

from composer_pipeline.actions import Action, ToolCall

TOOL_PROMPT = (
    "You can call these tools. To call one, answer with a block\n"
    '<tool_call>\n{"name": <tool name>, "arguments": {<argument>: <value>}}\n</tool_call>\n'
    "Tools:\n"
)


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return orjson.dumps(content).decode()


def plain_messages(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict[str, str]]:
    """Messages any ChatML-ish template renders: string content, tool calls and results as text
    (also used by the trainer for policies whose template cannot take ``tools``)."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, text = m.get("role", "user"), text_of(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                args = fn.get("arguments") or "{}"
                try:
                    args = orjson.loads(args) if isinstance(args, str) else args
                except orjson.JSONDecodeError:
                    args = {"_raw": args}
                calls.append(ToolCall(name=fn.get("name", ""), arguments=args if isinstance(args, dict) else {"_raw": args}))
            text = Action(text=text, tool_calls=tuple(calls)).to_text()
        elif role == "tool":
            role, text = "user", f"[tool result]\n{text}"
        elif role not in ("system", "user", "assistant"):
            role = "user"
        out.append({"role": role, "content": text})
    if tools:
        desc = TOOL_PROMPT + "\n".join(orjson.dumps(t.get("function", t)).decode() for t in tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + desc}
        else:
            out.insert(0, {"role": "system", "content": desc})
    return out
