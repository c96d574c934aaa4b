"""Chat messages through a tokenizer's chat template: the one prompt renderer.

In:  OpenAI chat messages (``content`` a string or parts, assistant ``tool_calls``, ``tool`` messages),
     the tool schemas and a tokenizer. Out: the prompt's token ids (:func:`prompt_ids`) or text
     (:func:`prompt_text`), with the generation prompt. A template that takes ``tools`` gets the
     messages natively (content as text, tool-call arguments as objects, so they render like
     ``Action.to_text``'s sorted keys); one that cannot (SmolLM2's) gets :func:`plain_messages`: tool
     calls in the ``<tool_call>`` text form of :mod:`composer_pipeline.actions`, tool results as user
     turns, the tool list in the system turn. The local teacher server, the trainer and the experiments
     all call these, so a local teacher and the policy being trained see the same tokens for a state.

Deliberately simplified: a prompt longer than its budget keeps its last ``max_tokens`` tokens (the
trainer's rule, which the read-before-edit experiment was measured with; the text is then the decoded
ids, which may re-tokenize differently at the cut). A teacher with a `context_window` has its request fitted by whole messages
before it is sent (``render.fit_messages``: system, request and recent turns); this cut is the local
model's last guard.
"""

from __future__ import annotations

from typing import Any

import orjson

from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.render import flatten_content  # the one content-to-text rule

TOOL_PROMPT = (
    "You can call these tools. To call one, answer with a block\n"
    '<tool_call>\n{"name": <tool name>, "arguments": {<argument>: <value>}}\n</tool_call>\n'
    "Tools:\n"
)


def _arguments(args: Any) -> Any:
    """A tool call's arguments as an object when they are a JSON string (OpenAI sends strings)."""
    if isinstance(args, str):
        try:
            return orjson.loads(args or "{}")
        except orjson.JSONDecodeError:
            return args  # unparseable: kept as it is
    return args


def native_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that takes ``tools``: content as text, tool-call arguments as objects."""
    out = []
    for m in messages:
        m = {**m, "content": flatten_content(m.get("content"))}
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **(fn := dict((c or {}).get("function") or {})),
                        "arguments": _arguments(fn.get("arguments")),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def render_text(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None) -> str:
    """The chat-template text with the generation prompt: native tools where the template takes them
    (and can render these messages), else the plain form."""
    if "tools" in (tokenizer.chat_template or ""):
        try:
            return tokenizer.apply_chat_template(
                native_messages(messages), tools=tools or None, tokenize=False, add_generation_prompt=True
            )
        except Exception:
            # the template cannot render these messages: fall back to the plain form
            pass
    return tokenizer.apply_chat_template(plain_messages(messages, tools), tokenize=False, add_generation_prompt=True)


def _ids(tokenizer, text: str) -> list[int]:
    # as apply_chat_template(tokenize=True) does
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _fit(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, max_tokens: int) -> tuple[str, list[int]]:
    """The rendered text and its ids (whole: :func:`prompt_ids` keeps the last ``max_tokens``)."""
    text = render_text(tokenizer, messages, tools)
    return text, _ids(tokenizer, text)


def prompt_ids(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, max_tokens: int) -> list[int]:
    """Token ids of the prompt, at most ``max_tokens`` (cut from the left)."""
    ids = _fit(tokenizer, messages, tools, max_tokens)[1]
    return ids[-max_tokens:] if len(ids) > max_tokens else ids


def prompt_text(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, max_tokens: int) -> str:
    """The text whose tokens are :func:`prompt_ids` (the rendered text itself unless a cut was needed)."""
    text, ids = _fit(tokenizer, messages, tools, max_tokens)
    return tokenizer.decode(ids[-max_tokens:]) if len(ids) > max_tokens else text


def plain_messages(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict[str, str]]:
    """Messages any ChatML-ish template renders: string content, tool calls and results as text
    (also used by the trainer for policies whose template cannot take ``tools``)."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, text = m.get("role", "user"), flatten_content(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                args = fn.get("arguments") or "{}"
                try:
                    args = orjson.loads(args) if isinstance(args, str) else args
                except orjson.JSONDecodeError:
                    args = {"_raw": args}
                calls.append(
                    ToolCall(name=fn.get("name", ""), arguments=args if isinstance(args, dict) else {"_raw": args})
                )
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
