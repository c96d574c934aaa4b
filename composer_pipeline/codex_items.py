"""One Codex CLI rollout line -> the content blocks the renderer reads (Claude Code's block shapes).

In:  a decoded rollout line: ``{timestamp, type, payload}`` (cli >= 0.3) or a bare ``ResponseItem``
(the early JSONL generation, cli 0.1-0.2).
Out: :func:`blocks_of`: ``text`` / ``image`` / ``thinking`` / ``tool_use`` / ``tool_result`` blocks, so
``render.Conversation`` builds a Codex prefix with the code it builds a Claude Code prefix with;
:func:`output_text` and :func:`failed`: a call's output as text and whether the call failed (the error site).

Top level (as ``salvage.py``) because ``render`` and ``ingest.codex`` both read it. The item shapes are
those of ``ResponseItem`` in openai/codex ``codex-rs/protocol/src/models.rs`` (read there, not copied):
``message`` (parts ``input_text`` / ``output_text`` / ``input_image``), ``reasoning`` (``summary[]``,
optional ``content[]``; ``encrypted_content`` is unreadable and never rendered), ``function_call``
(``arguments``: a JSON *string*), ``function_call_output`` (``output``: a string, in cli 0.3-0.4x a JSON
string ``{"output", "metadata": {"exit_code"}}``; an MCP call's result in the early JSONL a JSON string of
content items ``[{"text", "type": "text"}]``; a failure written as ``{"content", "success": false}``;
content items in newer versions), ``custom_tool_call`` (``input``: free text, e.g. ``apply_patch``),
``custom_tool_call_output``, ``local_shell_call`` (``action.command``), ``web_search_call``.

Deliberately simplified: a ``web_search_call`` is run by the provider and gets no output item, so it is
rendered as a line of the assistant's text, not as a call (every call in a prefix has an answer).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

ROLLOUT_LINE_TYPES = frozenset(
    {
        "session_meta",
        "response_item",
        "compacted",
        "turn_context",
        "event_msg",
        "inter_agent_communication",
        "inter_agent_communication_metadata",
        "world_state",
    }
)
# ResponseItem variants (``type``): what the agent did (assistant side) and what answered it
CALL_ITEMS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
ASSISTANT_ITEMS = CALL_ITEMS | {"reasoning", "web_search_call"}
OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
RESPONSE_ITEMS = ASSISTANT_ITEMS | OUTPUT_ITEMS | {"message", "ghost_snapshot", "compaction", "compaction_summary"}

# exec_command / unified exec (cli >= 0.115) and shell_command answer in text: "Process exited with code 1"
_EXIT_LINE = re.compile(r"(?m)^(?:Process exited with code|Exit code:)\s*(-?\d+)")


def item_of(obj: dict) -> dict | None:
    """The ``ResponseItem`` a line carries (``None``: the line is no response item)."""
    if obj.get("type") == "response_item":
        p = obj.get("payload")
        return p if type(p) is dict else None
    # early JSONL: bare items (a damaged line's list or object type is no set member)
    if "payload" not in obj and isinstance(obj.get("type"), str) and obj["type"] in RESPONSE_ITEMS:
        return obj
    return None


def _text_parts(content: Any) -> list[dict]:
    out: list[dict] = []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return out
    for part in content:
        if not isinstance(part, dict):
            continue
        t = part.get("type")
        if t in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif t == "input_image":
            out.append({"type": "image"})
    return out


def arguments_of(raw: Any) -> dict:
    """A function call's ``arguments`` (a JSON string) as an object; other values under ``input``."""
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"input": raw}
        return parsed if isinstance(parsed, dict) else {"input": parsed}
    return raw if isinstance(raw, dict) else {"input": raw}


def _decoded_output(output: Any) -> tuple[str, int | None, bool | None]:
    """``(text, exit_code, success)`` of an ``output`` as the rollout stores it."""
    if isinstance(output, dict):  # the failure shape {content, success}
        text, code, _ = _decoded_output(output.get("content"))
        ok = output.get("success")
        return text, code, ok if isinstance(ok, bool) else None
    if isinstance(output, list):  # content items
        return "\n".join(b["text"] for b in _text_parts(output) if b["type"] == "text"), None, None
    if not isinstance(output, str):
        return "" if output is None else orjson.dumps(output).decode(), None, None
    if output[:1] == "{":
        try:
            obj = orjson.loads(output)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and "output" in obj:
            meta = obj.get("metadata")
            code = meta.get("exit_code") if isinstance(meta, dict) else None
            return str(obj.get("output") or ""), code if type(code) is int else None, None
    # an MCP call's content items as a JSON string (early JSONL, 2025)
    if output[:1] == "[":
        texts = _content_item_texts(output)
        if texts is not None:
            return texts, None, None
    m = _EXIT_LINE.search(output[:4096])
    return output, int(m.group(1)) if m else None, None


def _content_item_texts(output: str) -> str | None:
    """The text of ``'[{"text": ..., "type": "text"}, ...]'``; ``None`` when the string is not such a list."""
    try:
        items = orjson.loads(output)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list) or not items:
        return None
    if not all(
        isinstance(i, dict) and isinstance(i.get("text"), str) and i.get("type", "text") == "text" for i in items
    ):
        return None
    return "\n".join(i["text"] for i in items)


def output_text(item: dict) -> str:
    return _decoded_output(item.get("output"))[0]


def failed(item: dict) -> bool:
    """A call output that is an error site: a non-zero exit code, or a call that failed."""
    text, code, ok = _decoded_output(item.get("output"))
    if code is not None:
        return code != 0
    if ok is False:
        return True
    return text.startswith(("err: ", "error: ", "Error: ")) or "apply_patch verification failed" in text[:400]


def call_id_of(item: dict) -> str:
    return str(item.get("call_id") or item.get("id") or "")


def blocks_of(obj: dict) -> list[dict] | None:
    """The content blocks of one decoded rollout line (``None``: nothing the renderer shows)."""
    if obj.get("type") == "compacted":
        p = obj.get("payload")
        return _compacted_blocks(p) if type(p) is dict else None
    item = item_of(obj)
    if item is None:
        return None
    t = item.get("type")
    if t == "message":
        return _text_parts(item.get("content"))
    if t == "reasoning":
        texts = [s.get("text") for s in item.get("summary") or [] if isinstance(s, dict)]
        texts += [c.get("text") for c in item.get("content") or [] if isinstance(c, dict)]
        text = "\n".join(x for x in texts if isinstance(x, str) and x)
        return [{"type": "thinking", "thinking": text}] if text else []
    if t == "function_call":
        args = arguments_of(item.get("arguments"))
        return [{"type": "tool_use", "id": call_id_of(item), "name": str(item.get("name") or ""), "input": args}]
    if t == "custom_tool_call":
        name = str(item.get("name") or "")
        return [{"type": "tool_use", "id": call_id_of(item), "name": name, "input": {"input": item.get("input")}}]
    if t == "local_shell_call":
        action = item.get("action")
        if not isinstance(action, dict):
            action = {}
        args = {k: v for k, v in action.items() if k != "type" and v is not None}
        return [{"type": "tool_use", "id": call_id_of(item), "name": "local_shell", "input": args}]
    if t == "web_search_call":
        action = item.get("action")
        if not isinstance(action, dict):
            action = {}
        what = action.get("query") or action.get("url") or ""
        return [{"type": "text", "text": f"[web search: {what}]"}]
    if t in OUTPUT_ITEMS:
        return [
            {
                "type": "tool_result",
                "tool_use_id": call_id_of(item),
                "content": output_text(item),
                "is_error": failed(item),
            }
        ]
    return None


def _compacted_blocks(payload: dict) -> list[dict]:
    """What the agent saw after a compaction: the kept history's user and assistant messages (newer cli),
    else the summary. Each block names the kept message it came from (``kept``) and its ``role``."""
    parts: list[dict] = []
    history = payload.get("replacement_history") or []
    for i, item in enumerate(history):
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") in ("user", "assistant"):
            parts += [{**p, "kept": i, "role": item["role"]} for p in _text_parts(item.get("content"))]
    message = payload.get("message")
    if isinstance(message, str) and message:
        parts.append({"type": "text", "text": message, "kept": len(history), "role": "user"})
    return parts


def kept_messages(blocks: Any) -> list[tuple[str, list[dict]]]:
    """A compaction's blocks as the messages it kept, in order: ``(role, blocks)`` each (``[]`` for blocks
    that are no compaction's)."""
    out: list[tuple[str, list[dict]]] = []
    last = None
    for b in blocks if isinstance(blocks, list) else []:
        if not isinstance(b, dict) or "kept" not in b:
            return []
        if b["kept"] != last:
            out.append((str(b.get("role") or "user"), []))
            last = b["kept"]
        out[-1][1].append(b)
    return out
