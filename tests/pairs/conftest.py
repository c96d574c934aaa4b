"""Fixtures for the pairs stage: a small hand-written session (states, messages, replays) and S3."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from composer_pipeline import tables
from composer_pipeline.actions import Action, ToolCall

KEY = "proj__s1"
STREAM = f"{KEY}:main"
SRC = "proj/s1.jsonl"

READ = Action(tool_calls=(ToolCall("Read", {"file_path": "/repo/src/app.py"}, id="toolu_1"),))
BASH = Action(tool_calls=(ToolCall("Bash", {"command": "pytest -q"}, id="toolu_2"),))
EDIT = Action(
    tool_calls=(
        ToolCall("Edit", {"file_path": "/repo/src/app.py", "old_string": "x = 1", "new_string": "x = 2"}, id="c"),
    )
)
DONE = Action(text="All tests pass now.")


def _blocks(action: Action) -> list[dict]:
    out = [{"type": "text", "text": action.text}] if action.text else []
    out += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in action.tool_calls]
    return out


def _msg(line, uuid, parent, rtype, content, message_key=None):
    record = {
        "type": rtype,
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": "sess-1",
        "message": {"role": rtype, "content": content},
    }
    return {
        "stream_id": STREAM,
        "session_key": KEY,
        "uuid": uuid,
        "parent_uuid": parent,
        "logical_parent_uuid": None,
        "record_type": rtype,
        "subtype": None,
        "message_key": message_key or uuid,
        "role": rtype,
        "is_meta": False,
        "is_compact_summary": False,
        "is_sidechain": False,
        "source_file": SRC,
        "line_no": line,
        "timestamp": f"2026-01-01T00:00:0{line}Z",
        "raw": orjson.dumps(record).decode(),
    }


def _state(state_id, action, leaf, line, uuid, msg_id, has_error=False):
    return {
        "state_id": state_id,
        "session_id": "sess-1",
        "session_key": KEY,
        "stream_id": STREAM,
        "stream_kind": "main",
        "agent_id": None,
        "parent_tool_use_id": None,
        "source_file": SRC,
        "source_lines": [line],
        "record_uuids": [uuid],
        "message_id": msg_id,
        "request_id": None,
        "prefix_leaf_uuid": leaf,
        "n_prefix_messages": line - 1,
        "action": action.to_json(),
        "error_after": None,
        "has_error": has_error,
        "model": "claude-x",
        "version": "2.1.0",
        "timestamp": "2026-01-01T00:00:00Z",
        "usage": None,
    }


def replay(state_id, teacher, action, status="answered", cost=0.001, created="2026-01-02T00:00:00Z", n=0):
    return {
        "call_id": f"{state_id}-{teacher}-{n}",
        "state_id": state_id,
        "session_key": KEY,
        "teacher": teacher,
        "model": f"{teacher}-model",
        "status": status,
        "reason": None if status == "answered" else "http 500",
        "action": action.to_json() if (action is not None and status == "answered") else None,
        "raw_answer": action.to_text() if action is not None else None,
        "cost_usd": cost,
        "reserved_usd": cost,
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "latency_s": 0.1,
        "attempts": 1,
        "cache_hit": False,
        "created_at": created,
    }


@pytest.fixture
def session_tables() -> dict[str, pa.Table]:
    """One session, three states: the agent reads (teachers agree), runs tests (teachers edit), says done."""
    messages = [
        _msg(1, "u1", None, "user", "Please fix the failing test in src/app.py"),
        _msg(2, "a1", "u1", "assistant", _blocks(READ), "m1"),
        _msg(3, "u2", "a1", "user", [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x = 1"}]),
        _msg(4, "a2", "u2", "assistant", _blocks(BASH), "m2"),
        _msg(5, "u3", "a2", "user", [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "1 failed"}]),
        _msg(6, "a3", "u3", "assistant", _blocks(DONE), "m3"),
    ]
    states = [
        _state("s_read_000000000001", READ, "u1", 2, "a1", "m1"),
        _state("s_bash_000000000002", BASH, "u2", 4, "a2", "m2", has_error=True),
        _state("s_done_000000000003", DONE, "u3", 6, "a3", "m3"),
    ]
    read_dot = Action(tool_calls=(ToolCall("Read", {"file_path": "/repo/./src/app.py", "limit": 50}),))
    replays = [
        # state 1: alpha + beta read the same file as the agent (path spelled differently) -> positive
        replay("s_read_000000000001", "alpha", read_dot),
        replay("s_read_000000000001", "beta", READ),
        replay("s_read_000000000001", "gamma", Action(tool_calls=(ToolCall("Bash", {"command": "ls"}),))),
        # state 2: alpha + beta edit, gamma agrees with the agent; alpha's older answer is superseded
        replay("s_bash_000000000002", "alpha", BASH, created="2026-01-01T00:00:00Z", n=0),
        replay("s_bash_000000000002", "alpha", EDIT, created="2026-01-03T00:00:00Z", n=1),
        replay("s_bash_000000000002", "beta", EDIT, cost=0.002),
        replay("s_bash_000000000002", "gamma", Action(tool_calls=(ToolCall("Bash", {"command": "pytest   -q "}),))),
        replay("s_bash_000000000002", "delta", None, status="failed", cost=0.0),
        # state 3: one similar text, one unrelated, one failure -> no consensus
        replay("s_done_000000000003", "alpha", Action(text="All tests pass now!")),
        replay("s_done_000000000003", "beta", None, status="failed"),
        replay("s_done_000000000003", "gamma", Action(text="Let me look at the database schema first.")),
    ]
    return {
        "trace_states": pa.Table.from_pylist(states, schema=tables.TRACE_STATES),
        "trace_messages": pa.Table.from_pylist(messages, schema=tables.TRACE_MESSAGES),
        "teacher_replays": pa.Table.from_pylist(replays, schema=tables.TEACHER_REPLAYS),
    }
