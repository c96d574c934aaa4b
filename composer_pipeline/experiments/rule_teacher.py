"""A rule-following teacher for the read-before-edit experiment, served over OpenAI-compatible HTTP.

In:  ``POST /v1/chat/completions`` bodies as the replay client sends them (OpenAI chat messages:
     assistant ``tool_calls`` with JSON-string arguments, ``tool`` results).
Out: the next action as ``<tool_call>`` text, with usage, so the normal replay path prices, caches and
     records it like any teacher's answer.

The rule (Claude Code's own: a file must be read before it is edited): the target is the file named in
the latest user request; if no successful ``Read`` of it follows that request, answer ``Read`` of it;
if it was read but not yet edited, answer ``Edit`` (old value from the file as read, new value from
the request); once edited, answer a short text. This stands in for strong API teachers on a
controlled task whose right answer is checkable; it is not a model.

Teachers disagree as real ones do: the request's ``model`` field picks a variant (:data:`VARIANTS`):
``rule`` (always right); ``noisy-1`` / ``noisy-2`` (right except at a seeded fifth of the states,
each its own fifth, where they take the other tool: edit an unread file, re-read a read one);
``writer`` (right, but writes the whole file with ``Write`` where the rule edits: another valid
action, so it never joins an ``Edit`` consensus). So the pair code sees 2-of-4, 3-of-4 and tied
states, and states with no consensus at all.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from composer_pipeline.actions import Action, ToolCall

PATH_RE = re.compile(r"(/[\w.\-]+(?:/[\w.\-]+)*\.\w+)")
KEY_RE = re.compile(r"\b([A-Z][A-Z_]{2,})\b")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _calls(m: dict) -> list[tuple[str, str, dict]]:
    out = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        try:
            args = orjson.loads(args) if isinstance(args, str) else dict(args or {})
        except orjson.JSONDecodeError:
            args = {}
        out.append((c.get("id") or "", fn.get("name") or "", args))
    return out


def is_error_result(content: str) -> bool:
    return "<tool_use_error>" in content or content.startswith("Error:")


def task_state(messages: list[dict]) -> dict[str, Any] | None:
    """Where the latest request stands: its target ``path``, ``read`` / ``edited`` flags, the
    request text and the file body as read (None when no user request names a file)."""
    start, found = None, None
    for i, m in enumerate(messages):
        if m.get("role") == "user" and (named := PATH_RE.search(_text(m.get("content")))):
            start, found = i, named
    if start is None or found is None:
        return None
    request = _text(messages[start].get("content"))
    path = found.group(1)
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages[start:] if m.get("role") == "tool"}
    st: dict[str, Any] = {"path": path, "read": False, "edited": False, "request": request, "body": None}
    for m in messages[start:]:
        if m.get("role") != "assistant":
            continue
        for cid, name, args in _calls(m):
            res = results.get(cid)
            if res is None or is_error_result(res) or args.get("file_path") != path:
                continue
            if name == "Read":
                st["read"], st["body"] = True, res
            elif name in ("Edit", "Write", "MultiEdit") and st["read"]:
                st["edited"] = True
    return st


def rule_action(messages: list[dict]) -> Action | None:
    """The rule's next action for a prompt (None: no file request in it)."""
    st = task_state(messages)
    if st is None:
        return None
    path = st["path"]
    if not st["read"]:
        return Action(tool_calls=(ToolCall("Read", {"file_path": path}, "call_0"),))
    request = st["request"].replace(path, " ")
    key = (KEY_RE.search(request) or KEY_RE.search(st["body"] or "") or ("", "VALUE"))[1]
    line = re.search(rf"{re.escape(key)} = (\d+)", st["body"] or "")
    old = line.group(1) if line else ""
    new = next((n for n in re.findall(r"\b\d+\b", request) if n != old), old)
    if st["edited"]:
        return Action(text=f"Done: {key} is {new} in {path}.")
    return Action(
        tool_calls=(
            ToolCall(
                "Edit", {"file_path": path, "old_string": f"{key} = {old}", "new_string": f"{key} = {new}"}, "call_0"
            ),
        )
    )


# share of the states a noisy variant answers wrongly
NOISE_SHARE = 0.2


def _noisy(variant: str, messages: list[dict]) -> bool:
    """Whether ``variant`` errs at this state: a hash of the variant and the conversation, so each noisy
    variant errs at its own fixed set of states (the same answer on every replay)."""
    h = hashlib.sha256(orjson.dumps([variant, messages], option=orjson.OPT_SORT_KEYS)).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < NOISE_SHARE


def variant_action(variant: str, messages: list[dict]) -> Action | None:
    """The next action of one teacher variant (see the module docstring); None: no file request."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown rule-teacher variant {variant!r}; known: {VARIANTS}")
    st, right = task_state(messages), rule_action(messages)
    if st is None or right is None or not right.tool_calls or variant == "rule":
        return right
    call = right.tool_calls[0]
    path = call.arguments["file_path"]
    if variant == "writer":
        if call.name != "Edit":
            return right
        body = re.sub(r"^\s*\d+\t", "", st["body"] or "", flags=re.M)
        content = body.replace(call.arguments["old_string"], call.arguments["new_string"])
        return Action(tool_calls=(ToolCall("Write", {"file_path": path, "content": content}, "call_0"),))
    if not _noisy(variant, messages):
        return right
    # the impatient agent's error: edit before reading
    if call.name == "Read":
        request = st["request"].replace(path, " ")
        key = (KEY_RE.search(request) or ("", "VALUE"))[1]
        old, new = (re.findall(r"\b\d+\b", request) + ["0", "0"])[:2]  # a guess: the file is unread
        return Action(
            tool_calls=(
                ToolCall(
                    "Edit",
                    {"file_path": path, "old_string": f"{key} = {old}", "new_string": f"{key} = {new}"},
                    "call_0",
                ),
            )
        )
    return Action(tool_calls=(ToolCall("Read", {"file_path": path}, "call_0"),))  # the over-careful one: read again


VARIANTS = ("rule", "noisy-1", "noisy-2", "writer")
# the request's model field: MODEL_PREFIX + variant
MODEL_PREFIX = "read-before-edit-"


def variant_of(model: str | None) -> str:
    """The variant a request's ``model`` field names (``read-before-edit-noisy-1`` -> ``noisy-1``);
    any other model name gets the plain rule."""
    v = (model or "").removeprefix(MODEL_PREFIX)
    return v if v in VARIANTS else "rule"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet
        pass

    def _send(self, status: int, payload: dict) -> None:
        raw = orjson.dumps(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "read-before-edit-rule", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        try:
            body = orjson.loads(raw)
            messages = body["messages"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self._send(400, {"error": {"message": "expected a JSON body with messages"}})
            return
        action = variant_action(variant_of(body.get("model")), messages) or Action(text="Nothing to change.")
        content = action.to_text()
        server = self.server
        if not isinstance(server, RuleTeacherServer):
            raise TypeError(f"the rule teachers' handler serves RuleTeacherServer only, not {type(server).__name__}")
        with server.lock:
            server.calls += 1
        self._send(
            200,
            {
                "id": "chatcmpl-rule",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                ],
                "usage": {
                    "prompt_tokens": len(raw) // 4,
                    "completion_tokens": len(content) // 4 + 1,
                    "total_tokens": len(raw) // 4 + len(content) // 4 + 1,
                },
            },
        )


class RuleTeacherServer(ThreadingHTTPServer):
    """``with RuleTeacherServer() as srv: srv.url`` -> ``http://127.0.0.1:<port>/v1``."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.lock = threading.Lock()
        self.calls = 0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> RuleTeacherServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
