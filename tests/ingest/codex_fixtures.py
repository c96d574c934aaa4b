"""Hand-written Codex CLI rollouts, one per generation the reader supports (shapes read in openai/codex:
``RolloutLine`` / ``RolloutItem``, ``ResponseItem`` in codex-rs/protocol; never a real user's file).

Each has fake keys planted where a rollout carries text: a call's ``arguments`` and ``output`` (JSON
strings, so the key is escaped twice on disk), a user message, ``session_meta.cwd`` (shell / exec), an
``agent_message`` event, and a git remote's password. ``write(root, generation)`` lays the file out as
Codex does (``YYYY/MM/DD/rollout-<ts>-<uuid>.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path

# fake secrets (published formats, none real)
ARG_KEY = "sk-ant-api03-" + "aRgUmEnT" * 5
OUTPUT_KEY = "ghp_" + "OuTpUt12" * 5
USER_KEY = "AKIAQWERTYUIOPASDFGH"
CWD_KEY = "sk-proj-" + "CwDcWd12" * 5
EVENT_KEY = "xoxb-2470385-98765432101-EvEnTmSgAbCdEfGh"
GIT_PASSWORD = "hunter2gitpass"
PLANTED = (ARG_KEY, OUTPUT_KEY, USER_KEY, CWD_KEY, EVENT_KEY, GIT_PASSWORD)

SESSION_IDS = {
    "early": "0196a1b2-0000-7000-8000-00000000e001",
    "shell": "0198c3d4-0000-7000-8000-00000000e002",
    "exec": "019ae5f6-0000-7000-8000-00000000e003",
}
GIT = {
    "commit_hash": "1f2e3d4c",
    "branch": "main",
    "repository_url": f"https://dev:{GIT_PASSWORD}@github.com/acme/app.git",
}


def _j(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _args(obj) -> str:
    """A function call's ``arguments``: JSON in a string, as the Responses API returns it."""
    return _j(obj)


def _msg(role: str, text: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _legacy_output(text: str, code: int) -> str:
    """cli 0.1-0.4x: the output as a JSON string with metadata.exit_code."""
    return _j({"output": text, "metadata": {"exit_code": code, "duration_seconds": 0.4}})


def early() -> list[str]:
    """cli 0.1-0.2 JSONL: a bare SessionMeta line, then bare ResponseItems and ``record_type: state`` lines."""
    items = [
        {"id": SESSION_IDS["early"], "timestamp": "2025-05-02T09:00:00.000Z", "instructions": None, "git": GIT},
        {"record_type": "state"},
        _msg("user", "<environment_context>\nCurrent working directory: /home/dev/app\n</environment_context>"),
        _msg("user", f"the tests fail, my AWS key is {USER_KEY} if you need it"),
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "**Running the tests**"}],
            "encrypted_content": "gAAAAABoEarly",
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "name": "shell",
            "arguments": _args({"command": ["bash", "-lc", f"ANTHROPIC_API_KEY={ARG_KEY} pytest -q"]}),
            "call_id": "call_e1",
        },
        {"type": "function_call_output", "call_id": "call_e1", "output": _legacy_output("1 failed, 3 passed", 1)},
        {"record_type": "state"},
        {
            "type": "function_call",
            "id": "fc_2",
            "name": "shell",
            "arguments": _args({"command": ["bash", "-lc", "cat calc.py"], "workdir": "/home/dev/app"}),
            "call_id": "call_e2",
        },
        {"type": "function_call_output", "call_id": "call_e2", "output": _legacy_output(f"TOKEN = '{OUTPUT_KEY}'", 0)},
        _msg("assistant", "The token is hard-coded in calc.py; the failing test expects it from the environment."),
    ]
    return [_j(i) for i in items]


def _line(ts: str, kind: str, payload: dict, **extra) -> str:
    return _j({"timestamp": ts, "type": kind, "payload": payload, **extra})


def shell() -> list[str]:
    """cli 0.3-0.4x: ``{timestamp, type, payload}`` lines, the ``shell`` tool (argv), JSON-string outputs,
    two parallel calls in one response."""
    t = "2025-09-10T14:00:0{}.000Z".format
    meta = {
        "id": SESSION_IDS["shell"],
        "timestamp": t(0),
        "cwd": f"/home/dev/{CWD_KEY}/app",
        "originator": "codex_cli_rs",
        "cli_version": "0.39.0",
        "instructions": None,
        "git": GIT,
    }
    call = {"type": "function_call", "name": "shell"}
    return [
        _line(t(0), "session_meta", meta),
        _line(
            t(1),
            "response_item",
            _msg("user", "<environment_context>\n  <cwd>/home/dev/app</cwd>\n</environment_context>"),
        ),
        _line(t(1), "turn_context", {"cwd": "/home/dev/app", "approval_policy": "on-request", "model": "gpt-5-codex"}),
        _line(t(1), "response_item", _msg("user", f"deploy it, key {USER_KEY}")),
        _line(t(1), "event_msg", {"type": "user_message", "message": f"deploy it, key {USER_KEY}", "images": []}),
        _line(t(2), "response_item", {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABoShell"}),
        _line(
            t(2),
            "response_item",
            {**call, "arguments": _args({"command": ["bash", "-lc", "ls"]}), "call_id": "call_s1"},
        ),
        _line(
            t(2),
            "response_item",
            {
                **call,
                "arguments": _args({"command": ["bash", "-lc", f"export OPENAI={ARG_KEY}; make deploy"]}),
                "call_id": "call_s2",
            },
        ),
        _line(
            t(3),
            "response_item",
            {"type": "function_call_output", "call_id": "call_s1", "output": _legacy_output("Makefile\nsrc", 0)},
        ),
        _line(
            t(3),
            "response_item",
            {
                "type": "function_call_output",
                "call_id": "call_s2",
                "output": _legacy_output(f"denied for {OUTPUT_KEY}", 2),
            },
        ),
        _line(
            t(3),
            "event_msg",
            {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 900, "output_tokens": 40}}},
        ),
        _line(t(4), "response_item", _msg("assistant", "The deploy was denied: the token lacks the scope.")),
        _line(t(4), "event_msg", {"type": "agent_message", "message": f"denied; rotate {EVENT_KEY}"}),
    ]


def _exec_output(text: str, code: int) -> str:
    """cli >= 0.115 exec_command: plain text with the exit code in a line."""
    return f"Chunk ID: 4f1a\nWall time: 0.2 seconds\nProcess exited with code {code}\nOriginal token count: 12\nOutput:\n{text}"


def exec_() -> list[str]:
    """cli >= 0.115: ``exec_command`` (``cmd``), plain-text outputs, ``apply_patch`` as a custom tool call,
    a compaction with ``replacement_history``, ``ordinal`` on every line."""
    t = "2026-03-04T08:00:{:02d}.000Z".format
    lines = [
        (
            "session_meta",
            {
                "id": SESSION_IDS["exec"],
                "timestamp": t(0),
                "cwd": f"/home/dev/{CWD_KEY}/svc",
                "originator": "codex_cli_rs",
                "cli_version": "0.118.0",
                "source": "cli",
                "model_provider": "openai",
                "base_instructions": {"text": "You are Codex."},
                "git": GIT,
            },
        ),
        ("turn_context", {"cwd": "/home/dev/svc", "approval_policy": "never", "model": "gpt-5.2-codex"}),
        (
            "response_item",
            _msg("developer", "<permissions instructions>sandbox: workspace-write</permissions instructions>"),
        ),
        ("response_item", _msg("user", f"bump the version; the registry token is {USER_KEY}")),
        (
            "response_item",
            {
                "type": "function_call",
                "name": "exec_command",
                "arguments": _args({"cmd": "cat VERSION", "workdir": "/home/dev/svc"}),
                "call_id": "call_x1",
            },
        ),
        ("response_item", {"type": "function_call_output", "call_id": "call_x1", "output": _exec_output("1.4.0", 0)}),
        (
            "response_item",
            {
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": "call_x2",
                "name": "apply_patch",
                "input": "*** Begin Patch\n*** Update File: VERSION\n-1.4.0\n+1.5.0\n*** End Patch\n",
            },
        ),
        (
            "response_item",
            {
                "type": "custom_tool_call_output",
                "call_id": "call_x2",
                "output": _legacy_output("Success. Updated the following files:\nM VERSION", 0),
            },
        ),
        (
            "compacted",
            {
                "message": "",
                "replacement_history": [
                    _msg("user", "bump the version"),
                    _msg("assistant", "Summary: VERSION now says 1.5.0; publishing is next."),
                ],
            },
        ),
        ("turn_context", {"cwd": "/home/dev/svc", "approval_policy": "never", "model": "gpt-5.2-codex"}),
        (
            "response_item",
            {
                "type": "function_call",
                "name": "exec_command",
                "arguments": _args({"cmd": f"NPM_TOKEN={ARG_KEY} npm publish"}),
                "call_id": "call_x3",
            },
        ),
        (
            "response_item",
            {"type": "function_call_output", "call_id": "call_x3", "output": _exec_output(f"403 for {OUTPUT_KEY}", 1)},
        ),
        ("event_msg", {"type": "agent_message", "message": f"publish failed ({EVENT_KEY})"}),
        ("response_item", _msg("assistant", "Publishing failed with 403; the token cannot publish.")),
    ]
    return [_line(t(i), kind, payload, ordinal=i) for i, (kind, payload) in enumerate(lines)]


def _command_item(cmd: str, code: int) -> dict:
    """An ``item_completed`` event of a command a script ran (cli >= 0.15x)."""
    item = {
        "type": "CommandExecution",
        "id": f"item-{code}",
        "command": ["/bin/zsh", "-lc", cmd],
        "status": "completed" if code == 0 else "failed",
        "aggregated_output": f"output of {cmd}",
        "exit_code": code,
    }
    return {"type": "item_completed", "turn_id": "turn-1", "item": item}


def code_mode() -> list[str]:
    """cli >= 0.15x "code mode": one ``exec`` custom call runs a script of several commands; each command's
    exit code is only in an ``item_completed`` event between the call and its output (content items)."""
    t = "2026-09-06T10:00:{:02d}.000Z".format
    script = 'text(await tools.exec_command({cmd:"ls"}));\ntext(await tools.exec_command({cmd:"rg -n TODO web"}));\n'
    lines = [
        ("session_meta", {"id": SESSION_IDS["exec"], "cwd": "/home/dev/svc", "cli_version": "0.153.0"}),
        ("response_item", _msg("user", "find the TODOs")),
        ("response_item", _msg("assistant", "Listing files and searching for TODOs.")),
        (
            "response_item",
            {"type": "custom_tool_call", "status": "completed", "call_id": "call_e1", "name": "exec", "input": script},
        ),
        ("token_usage_record", {"turn_id": "turn-1", "usage": {"input_tokens": 10, "output_tokens": 2}}),
        ("event_msg", _command_item("ls", 0)),
        ("event_msg", _command_item("rg -n TODO web", 2)),
        (
            "response_item",
            {
                "type": "custom_tool_call_output",
                "call_id": "call_e1",
                "output": [
                    {"type": "input_text", "text": "Script completed\nOutput:\n"},
                    {"type": "input_text", "text": "src"},
                ],
            },
        ),
        ("response_item", _msg("assistant", "There is no web folder; the search failed.")),
    ]
    return [_line(t(i), kind, payload, ordinal=i) for i, (kind, payload) in enumerate(lines)]


def mcp_output() -> list[str]:
    """Early JSONL with an MCP tool call whose ``output`` is a JSON *string* of content items
    (``[{"text": ..., "type": "text"}]``), as a real September 2025 rollout stores it."""
    result = _j({"data": {"nextTask": {"id": "7.2", "title": "Write the scanner docs"}}})
    items = [
        {"id": SESSION_IDS["early"], "timestamp": "2025-09-10T18:58:38.331Z", "instructions": None},
        {"record_type": "state"},
        _msg("user", "What is the next task?"),
        _msg("assistant", "Checking the task list."),
        {
            "type": "function_call",
            "name": "tasks__next_task",
            "arguments": _args({"projectRoot": "/home/dev/app"}),
            "call_id": "call_m1",
        },
        {"type": "function_call_output", "call_id": "call_m1", "output": _j([{"text": result, "type": "text"}])},
        {"record_type": "state"},
        _msg("assistant", "Next is 7.2: write the scanner docs."),
    ]
    return [_j(i) for i in items]


def kept_history() -> list[str]:
    """A compaction that keeps the conversation's messages, as cli 0.104 Desktop writes it: the user's
    prompts and the assistant's final answers with their roles, developer messages, an image part, and a
    ``compaction`` item of encrypted content (``replacement_history``), then a ``context_compacted`` event."""
    t = "2026-02-24T09:50:{:02d}.000Z".format
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    kept = [
        _msg("user", "add a dark mode"),
        {**_msg("assistant", "Dark mode is in: a toggle in the header."), "phase": "final_answer"},
        _msg("developer", "<permissions instructions>sandbox: workspace-write</permissions instructions>"),
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "the toggle overlaps"}, image]},
        {"type": "compaction", "encrypted_content": "gAAAAABcompactedsummary"},
    ]
    call = {"type": "function_call", "name": "exec_command", "arguments": _args({"cmd": "rg -n toggle src"})}
    lines = [
        ("session_meta", {"id": SESSION_IDS["exec"], "cwd": "/home/dev/web", "cli_version": "0.104.0"}),
        ("response_item", _msg("user", "add a dark mode")),
        ("response_item", {**_msg("assistant", "Dark mode is in: a toggle in the header."), "phase": "final_answer"}),
        ("response_item", _msg("user", "the toggle overlaps")),
        ("compacted", {"message": "", "replacement_history": kept}),
        ("event_msg", {"type": "context_compacted"}),
        ("response_item", _msg("assistant", "Looking at the header layout.")),
        ("response_item", {**call, "call_id": "call_k1"}),
        (
            "response_item",
            {"type": "function_call_output", "call_id": "call_k1", "output": _exec_output("Header.tsx:12", 0)},
        ),
        ("response_item", _msg("assistant", "Moved the toggle out of the title row.")),
    ]
    return [_line(t(i), kind, payload) for i, (kind, payload) in enumerate(lines)]


GENERATIONS = {"early": early, "shell": shell, "exec": exec_}
# assistant steps (text or calls) per generation: every one must become a state
STEPS = {"early": 3, "shell": 2, "exec": 4}


def write(root: Path, generation: str, lines: list[str] | None = None) -> Path:
    sid = SESSION_IDS[generation]
    day = root / "2026" / "03" / "04"
    day.mkdir(parents=True, exist_ok=True)
    path = day / f"rollout-2026-03-04T08-00-00-{sid}.jsonl"
    path.write_text("\n".join(lines if lines is not None else GENERATIONS[generation]()) + "\n")
    return path
