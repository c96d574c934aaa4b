"""The project's own Claude Code corpus: synthetic sessions covering every format feature the tests need.

``write_corpus(root)`` writes the same files every time (uuids from a private counter) in the layout of
``~/.claude/projects``: three project directories, one per format generation, 13 files, 46 states.
Every feature the parser handles (docs/ARCHITECTURE.md, "Ids" and "Rendering") appears at least once:

* 2.1.x (``acme__toolsmith``): responses split over several records, one of them split *around* a tool
  result; parallel calls; ``hook_progress``/``bash_progress`` records inside the parentUuid chain;
  ``agent_progress`` copies of a subagent's messages (not states); ``<session>/subagents/agent-<17 hex>``
  linked through ``toolUseResult.agentId``; an ``agent-acompact-*`` worker whose first parent lies in
  the main file; ``compact_boundary`` + ``isCompactSummary``; ``system/api_error`` and a ``<synthetic>``
  API-error response (not a state); ``sourceToolAssistantUUID``; ``permissionMode``; ``caller``; a
  string ``toolUseResult`` error; two parallel calls the user rejected, then an interrupt; a
  truncated last line; timestamps that go backwards.
* 2.0.x (``beta__webapp``): a sibling ``agent-<7 hex>.jsonl`` linked by ``agentId``; a Warmup stub;
  a rewind (a user turn re-parented to an earlier record); ``file-history-snapshot``,
  ``queue-operation``, ``summary`` and ``system`` records; files holding only summaries, only
  snapshots, and a 0-byte file.
* 1.0.x (``gamma__legacy``): two inline sidechains (``isSidechain``, ``parentUuid: null``) with
  interleaved records, linked to their Task calls by prompt text; Task results as content lists; an
  old-style ``summary`` at the top; a Windows ``cwd``; ``isMeta`` command records; an interrupt; a
  session resumed under a newer version (version read per record).

``EXPECTED`` holds the facts counted by hand from the code below (not from the parser): states per
file, the split response's lines, the links. Written for the tests; the pipeline never imports it.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from pathlib import Path

from .sessions import Session, text, thinking, tool

TOOLSMITH, WEBAPP, LEGACY = "acme__toolsmith", "beta__webapp", "gamma__legacy"
# 2.1.38 main session with subagents/ and a compaction
T1 = "71a2c0de-0000-4000-8000-000000000001"
# 2.1.39: two parallel calls rejected, then an interrupt
T2 = "72b3d1ef-0000-4000-8000-000000000002"
# 2.1.9: tool heavy, bash_progress in the chain
T3 = "73c4e2f0-0000-4000-8000-000000000003"
# 2.0.74: sibling agent file, Warmup stub, a rewind
W1 = "84d5f3a1-0000-4000-8000-000000000004"
W2 = "85e6a4b2-0000-4000-8000-000000000005"  # summaries only
W3 = "86f7b5c3-0000-4000-8000-000000000006"  # file-history-snapshots only
W4 = "87a8c6d4-0000-4000-8000-000000000007"  # 0 bytes (a --resume with no action)
L1 = "98b9d7e5-0000-4000-8000-000000000008"  # 1.0.98: two inline sidechains
L2 = "99cae8f6-0000-4000-8000-000000000009"  # 1.0.98 resumed under 1.0.108
SUB_AGENT, COMPACT_AGENT = "a4f0c2e81b3d5a7c9", "acompact-5e1d2c"  # 2.1.x subagents/ files
SIB_AGENT, WARMUP_AGENT = "a7c31f0", "a0f9e8d"  # 2.0.x sibling files

REJECTED = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file "
    "edit, the new_string was NOT written to the file). STOP what you are doing and wait for the user to "
    "tell you how to proceed."
)
LONG_LOG = "\n".join(f"tests/test_cli.py::test_flag_{i} PASSED" for i in range(40))

EXPECTED = {
    # states per file: one per distinct assistant message id (agent_progress copies, the <synthetic>
    # API error and the Warmup stub excluded)
    "states": {
        f"{TOOLSMITH}/{T1}.jsonl": 9,
        f"{TOOLSMITH}/{T1}/subagents/agent-{SUB_AGENT}.jsonl": 2,
        f"{TOOLSMITH}/{T1}/subagents/agent-{COMPACT_AGENT}.jsonl": 1,
        f"{TOOLSMITH}/{T2}.jsonl": 1,
        f"{TOOLSMITH}/{T3}.jsonl": 12,
        f"{WEBAPP}/{W1}.jsonl": 7,
        f"{WEBAPP}/agent-{SIB_AGENT}.jsonl": 2,
        f"{WEBAPP}/agent-{WARMUP_AGENT}.jsonl": 0,
        f"{WEBAPP}/{W2}.jsonl": 0,
        f"{WEBAPP}/{W3}.jsonl": 0,
        f"{WEBAPP}/{W4}.jsonl": 0,
        # 3 main + 2 + 3 in the inline sidechains
        f"{LEGACY}/{L1}.jsonl": 8,
        f"{LEGACY}/{L2}.jsonl": 4,
    },
    "total_states": 46,
    # stream kinds and their states
    "kinds": {"main": 36, "inline_sidechain": 5, "sibling_agent_file": 2, "subagents_dir": 3},
    # the acompact worker: no Task call spawned it
    "unlinked_subagent_states": 1,
    "bad_lines": {f"{TOOLSMITH}/{T1}.jsonl": 1},  # the truncated last line
    # msg_T1_01 is one response split over records on lines 4-6 and 8, around the Glob result (line 7)
    "split": {
        "session_key": f"{TOOLSMITH}__{T1}",
        "message_id": "msg_T1_01",
        "source_lines": [4, 5, 6, 8],
        "tools": ["Glob", "Grep"],
        "source_file": f"{TOOLSMITH}/{T1}.jsonl",
    },
    # stream kind -> (parent tool_use id, agent id)
    "subagent_links": {
        "subagents_dir": ("toolu_T1_task", SUB_AGENT),
        "sibling_agent_file": ("toolu_W1_task", SIB_AGENT),
    },
    "inline_links": ["toolu_L1_task_models", "toolu_L1_task_sql"],
    "rejected": {"session_key": f"{TOOLSMITH}__{T2}", "tools": ["Bash", "Glob"]},
    # W1: the user turn on line 21 restarts from the result on line 12, so msg_W1_04/05 are not in
    # the prefix of msg_W1_06
    "rewind": {
        "session_key": f"{WEBAPP}__{W1}",
        "message_id": "msg_W1_06",
        "last_user": "Ok in the future, run the linter first",
        "dropped_user": "Ok, and add a test",
    },
    "versions": {"1.0.98", "1.0.108", "2.0.74", "2.0.76", "2.1.9", "2.1.38", "2.1.39"},
    "min_typed_lines": 150,
    # JSON-object lines; assistant lines with block lists
    "min_assistant_lines": 70,
    "min_tool_calls": 120,
    # over every state's rendered prefix (130 and 12)
    "min_parallel_calls": 10,
    # a directory with error sites, subagents and tool calls for pair/train tests
    "pairs_subdir": TOOLSMITH,
}


def _uuids(seed: str):
    """Deterministic random-looking uuid4s (the first 8 hex name inline sidechain streams)."""
    counter = itertools.count(1)

    def new() -> str:
        digest = hashlib.sha256(f"{seed}:{next(counter)}".encode()).digest()[:16]
        return str(uuid.UUID(bytes=digest, version=4))

    return new


def _clock(start_minute: int):
    """Increasing ISO timestamps, one second apart; ``back(n)`` jumps back n seconds."""
    t = itertools.count(start_minute * 60)

    def now(back: int = 0) -> str:
        s = next(t) - back
        return f"2026-01-0{1 + s // 86400}T{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}.000Z"

    return now


def _asst(s: Session, now, mid: str, *blocks, model: str = "claude-sonnet-4-5-20250929", **kw) -> list[str]:
    """One API response, one record per content block (the streaming split), each with a timestamp."""
    out = []
    for b in blocks:
        out += s.assistant(b, parent="LAST", mid=mid, model=model, timestamp=now(), **kw)
    return out


def _toolsmith(root: Path, new) -> None:
    d = root / TOOLSMITH
    now = _clock(10)
    # ---- T1: 2.1.38 main session ---------------------------------------------------------------------
    m = Session(T1, "2.1.38", new_uuid=new, cwd="/home/dev/toolsmith")
    m.obj(
        {
            "type": "file-history-snapshot",
            "messageId": "snap-1",
            "isSnapshotUpdate": False,
            "snapshot": {"messageId": "snap-1", "trackedFileBackups": {}, "timestamp": now()},
        }
    )  # line 1
    m.rec(
        "progress",
        parent=None,
        data={"type": "hook_progress", "hookEvent": "SessionStart", "hookName": "startup"},
        parentToolUseID="session-start",
        toolUseID="session-start",
        timestamp=now(),
    )  # line 2
    m.user("add a --verbose flag to the CLI", permissionMode="default", timestamp=now())  # line 3
    a1 = _asst(
        m,
        now,
        "msg_T1_01",
        thinking("Find the CLI entry point first."),
        text("Let me look at the CLI."),
        tool("Glob", "toolu_T1_glob", pattern="**/cli.py"),
    )  # lines 4-6
    m.result(
        "toolu_T1_glob",
        "src/toolsmith/cli.py",
        tur={"filenames": ["src/toolsmith/cli.py"], "numFiles": 1},
        sourceToolAssistantUUID=a1[-1],
        timestamp=now(),
    )  # line 7
    a1b = _asst(m, now, "msg_T1_01", tool("Grep", "toolu_T1_grep", pattern="add_argument", path="src"))  # line 8
    m.result(
        "toolu_T1_grep",
        "src/toolsmith/cli.py:12: parser.add_argument('--quiet')",
        sourceToolAssistantUUID=a1b[-1],
        timestamp=now(),
    )
    a2 = _asst(
        m,
        now,
        "msg_T1_02",
        text("Reading the parser and its tests."),
        tool("Read", "toolu_T1_read1", file_path="src/toolsmith/cli.py"),
        tool("Read", "toolu_T1_read2", file_path="tests/test_cli.py"),
        tool("Bash", "toolu_T1_bash1", command="python -m pytest tests/test_cli.py -q"),
    )
    m.rec(
        "progress",
        data={"type": "hook_progress", "hookEvent": "PostToolUse", "hookName": "PostToolUse:Read"},
        parentToolUseID="toolu_T1_read1",
        toolUseID="toolu_T1_read1",
        timestamp=now(),
    )
    m.result(
        "toolu_T1_read1",
        "import argparse\n\ndef main():\n    parser = argparse.ArgumentParser()\n",
        tur={"type": "text", "file": {"filePath": "src/toolsmith/cli.py", "numLines": 4}},
        sourceToolAssistantUUID=a2[1],
        timestamp=now(),
    )
    m.result(
        "toolu_T1_read2",
        [text("def test_quiet():"), text("    assert run(['--quiet']) == 0")],
        sourceToolAssistantUUID=a2[2],
        timestamp=now(),
    )
    m.result(
        "toolu_T1_bash1",
        LONG_LOG,
        tur={"stdout": LONG_LOG, "stderr": "", "interrupted": False},
        sourceToolAssistantUUID=a2[3],
        timestamp=now(),
    )
    a3 = _asst(
        m,
        now,
        "msg_T1_03",
        tool(
            "Task",
            "toolu_T1_task",
            description="survey tests",
            prompt="Survey the test suite for flag handling",
            subagent_type="general-purpose",
        ),
    )
    m.rec(
        "progress",
        data={
            "type": "agent_progress",
            "agentId": SUB_AGENT,
            "prompt": "Survey the test suite for flag handling",
            "message": {
                "type": "assistant",
                "message": {
                    "id": "msg_T1_sub_01",
                    "role": "assistant",
                    "content": [tool("Grep", "toolu_T1_sub_grep", pattern="--")],
                },
            },
        },
        parentToolUseID="toolu_T1_task",
        toolUseID="agent_msg_1",
        timestamp=now(),
    )
    m.result(
        "toolu_T1_task",
        [text("## Flags\n- --quiet is tested in tests/test_cli.py")],
        tur={
            "status": "completed",
            "prompt": "Survey the test suite for flag handling",
            "agentId": SUB_AGENT,
            "content": [text("## Flags\n- --quiet is tested in tests/test_cli.py")],
            "totalDurationMs": 5123,
            "totalTokens": 2048,
            "totalToolUseCount": 1,
        },
        sourceToolAssistantUUID=a3[0],
        timestamp=now(),
    )
    a4 = _asst(
        m,
        now,
        "msg_T1_04",
        tool(
            "Edit",
            "toolu_T1_edit1",
            file_path="src/toolsmith/cli.py",
            old_string="parser.add_argument('--quiet')",
            new_string="parser.add_argument('--verbose')",
        ),
    )
    m.result(
        "toolu_T1_edit1",
        "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>",
        is_error=True,
        tur="Error: File has not been read yet. Read it first before writing to it.",
        sourceToolAssistantUUID=a4[0],
        timestamp=now(),
    )
    a5 = _asst(
        m,
        now,
        "msg_T1_05",
        thinking("It was read through a Task, not by me; read it again."),
        tool("Read", "toolu_T1_read3", file_path="src/toolsmith/cli.py"),
        tool(
            "Edit",
            "toolu_T1_edit2",
            file_path="src/toolsmith/cli.py",
            old_string="# flags",
            new_string="parser.add_argument('--verbose')",
        ),
    )
    m.result("toolu_T1_read3", "import argparse\n# flags\n", sourceToolAssistantUUID=a5[1], timestamp=now())
    m.result(
        "toolu_T1_edit2",
        "The file src/toolsmith/cli.py has been updated.",
        tur={"filePath": "src/toolsmith/cli.py", "structuredPatch": [{"oldStart": 2, "lines": ["-# flags"]}]},
        sourceToolAssistantUUID=a5[2],
        timestamp=now(),
    )
    m.rec(
        "system",
        subtype="api_error",
        level="error",
        error={"status": 529, "message": "Overloaded"},
        retryInMs=600,
        retryAttempt=1,
        maxRetries=10,
        timestamp=now(),
    )
    m.assistant(
        text("API Error: 529 Overloaded"),
        mid="msg_T1_synthetic",
        model="<synthetic>",
        isApiErrorMessage=True,
        timestamp=now(),
    )
    m.rec("system", subtype="turn_duration", durationMs=48210, timestamp=now(back=30))  # the clock goes backwards
    m.user("now run the tests", permissionMode="default", timestamp=now())
    _asst(m, now, "msg_T1_06", tool("Bash", "toolu_T1_bash2", command="python -m pytest -q", caller={"type": "direct"}))
    m.result(
        "toolu_T1_bash2", "12 passed", tur={"stdout": "12 passed", "stderr": "", "interrupted": False}, timestamp=now()
    )
    pre_compact = m.last
    m.rec(
        "system",
        parent=None,
        subtype="compact_boundary",
        content="Conversation compacted",
        logicalParentUuid=pre_compact,
        compactMetadata={"trigger": "auto", "preTokens": 151234},
        timestamp=now(),
    )
    m.user(
        "This session is being continued from a previous conversation. Summary: a --verbose flag was added to "
        "src/toolsmith/cli.py and the tests pass.",
        isCompactSummary=True,
        isVisibleInTranscriptOnly=True,
        timestamp=now(),
    )
    m.user("also update the README", permissionMode="acceptEdits", timestamp=now())
    _asst(m, now, "msg_T1_07", tool("Read", "toolu_T1_read4", file_path="README.md"))
    m.result("toolu_T1_read4", "# toolsmith\n\nUsage: toolsmith [--quiet]\n", timestamp=now())
    _asst(
        m,
        now,
        "msg_T1_08",
        tool(
            "Edit", "toolu_T1_edit3", file_path="README.md", old_string="[--quiet]", new_string="[--quiet] [--verbose]"
        ),
    )
    m.result("toolu_T1_edit3", "The file README.md has been updated.", timestamp=now())
    _asst(m, now, "msg_T1_09", text("Done: `--verbose` is added, tested and documented."))
    m.obj({"type": "summary", "summary": "Add a --verbose flag", "leafUuid": m.last})
    m.raw(
        '{"parentUuid":"%s","isSidechain":false,"type":"user","message":{"role":"user","content":"one more th' % m.last
    )
    m.write(d / f"{T1}.jsonl")
    # its subagent (2.1.x layout), linked through toolUseResult.agentId and agent_progress
    s = Session(T1, "2.1.38", agent_id=SUB_AGENT, sidechain=True, new_uuid=new, cwd="/home/dev/toolsmith")
    s.user("Survey the test suite for flag handling", parent=None, timestamp=now())
    _asst(s, now, "msg_T1_sub_01", tool("Grep", "toolu_T1_sub_grep", pattern="--", path="tests"))
    s.result("toolu_T1_sub_grep", "tests/test_cli.py:1: def test_quiet():", timestamp=now())
    _asst(s, now, "msg_T1_sub_02", text("## Flags\n- --quiet is tested in tests/test_cli.py"))
    s.write(d / T1 / "subagents" / f"agent-{SUB_AGENT}.jsonl")
    # the compaction worker: its first record's parent is in the main file
    c = Session(T1, "2.1.38", agent_id=COMPACT_AGENT, sidechain=True, new_uuid=new, cwd="/home/dev/toolsmith")
    c.last = pre_compact
    c.user("Your task is to create a detailed summary of the conversation so far.", timestamp=now())
    _asst(c, now, "msg_T1_compact", text("<summary>A --verbose flag was added; tests pass.</summary>"))
    c.write(d / T1 / "subagents" / f"agent-{COMPACT_AGENT}.jsonl")

    # ---- T2: 2.1.39, both parallel calls rejected by the user, then an interrupt ---------------------
    r = Session(T2, "2.1.39", new_uuid=new, cwd="/home/dev/toolsmith")
    r.user("clean up the build directory", timestamp=now())
    a = _asst(
        r,
        now,
        "msg_T2_01",
        tool("Bash", "toolu_T2_rm", command="rm -rf build"),
        tool("Glob", "toolu_T2_glob", pattern="build/**"),
    )
    for tid, src in (("toolu_T2_rm", a[0]), ("toolu_T2_glob", a[1])):
        r.result(tid, REJECTED, is_error=True, tur="Error: " + REJECTED, sourceToolAssistantUUID=src, timestamp=now())
    r.user([text("[Request interrupted by user for tool use]")], timestamp=now())
    r.write(d / f"{T2}.jsonl")

    # ---- T3: 2.1.9, tool heavy, bash_progress records in the chain -----------------------------------
    h = Session(T3, "2.1.9", new_uuid=new, cwd="/home/dev/toolsmith")
    h.user("make the linter happy", timestamp=now())
    for i in range(11):
        name = ("Read", "Grep", "Edit", "Bash")[i % 4]
        args = {
            "Read": {"file_path": f"src/toolsmith/mod{i}.py"},
            "Grep": {"pattern": f"TODO{i}"},
            "Edit": {"file_path": f"src/toolsmith/mod{i}.py", "old_string": "x ", "new_string": "x"},
            "Bash": {"command": "ruff check src"},
        }[name]
        _asst(h, now, f"msg_T3_{i + 1:02d}", text(f"Step {i + 1}."), tool(name, f"toolu_T3_{i + 1:02d}", **args))
        if name == "Bash":
            h.rec(
                "progress",
                data={"type": "bash_progress", "output": "checking...", "elapsedTimeSeconds": 2},
                parentToolUseID=f"toolu_T3_{i + 1:02d}",
                toolUseID=f"bash-progress-{i}",
                timestamp=now(),
            )
        out = "All checks passed!" if name == "Bash" and i > 4 else f"{name} output {i}"
        h.result(f"toolu_T3_{i + 1:02d}", out, is_error=(name == "Bash" and i <= 4) or None, timestamp=now())
    _asst(h, now, "msg_T3_12", text("The linter is happy."))
    h.write(d / f"{T3}.jsonl")


def _webapp(root: Path, new) -> None:
    d = root / WEBAPP
    now = _clock(200)
    m = Session(W1, "2.0.74", new_uuid=new, cwd="/home/dev/webapp")
    m.obj(
        {
            "type": "file-history-snapshot",
            "messageId": "snap-w1",
            "isSnapshotUpdate": False,
            "snapshot": {"messageId": "snap-w1", "trackedFileBackups": {}, "timestamp": now()},
        }
    )  # line 1
    m.user("the login form double-submits; fix it", timestamp=now())  # line 2
    _asst(
        m,
        now,
        "msg_W1_01",
        thinking("Start with the form component."),
        tool("Read", "toolu_W1_read", file_path="src/login.tsx"),
    )  # lines 3-4
    m.result(
        "toolu_W1_read",
        "export function Login() { return <form onSubmit={submit}/> }",
        tur={"type": "text", "file": {"filePath": "src/login.tsx", "numLines": 1}},
        timestamp=now(),
    )  # 5
    _asst(
        m,
        now,
        "msg_W1_02",
        tool(
            "Task",
            "toolu_W1_task",
            description="find submit sites",
            prompt="Find every place that submits the login form",
        ),
    )  # 6
    m.result(
        "toolu_W1_task",
        [text("## Submit sites\n- src/login.tsx:1\n- src/api.ts:40")],
        tur={
            "status": "completed",
            "prompt": "Find every place that submits the login form",
            "agentId": SIB_AGENT,
            "content": [text("## Submit sites")],
            "totalDurationMs": 3100,
        },
        timestamp=now(),
    )  # 7
    _asst(
        m,
        now,
        "msg_W1_03",
        text("Disable the button while submitting."),
        tool("Edit", "toolu_W1_edit", file_path="src/login.tsx", old_string="<form", new_string="<form aria-busy"),
    )  # 8-9
    m.rec(
        "system",
        subtype="stop_hook_summary",
        hookCount=1,
        hookInfos=[],
        hookErrors=[],
        preventedContinuation=False,
        stopReason="",
        toolUseID="toolu_W1_edit",
        level="info",
        timestamp=now(),
    )  # 10
    m.rec(
        "system",
        subtype="local_command",
        content="<local-command-stdout>ok</local-command-stdout>",
        level="info",
        timestamp=now(),
    )  # 11
    edit_result = m.result(
        "toolu_W1_edit",
        "The file src/login.tsx has been updated.",
        tur={"filePath": "src/login.tsx", "structuredPatch": []},
        timestamp=now(),
    )  # 12
    m.obj(
        {"type": "queue-operation", "operation": "enqueue", "timestamp": now(), "sessionId": W1, "content": "and tests"}
    )
    m.user("Ok, and add a test", timestamp=now())  # 14
    _asst(
        m,
        now,
        "msg_W1_04",
        tool("Write", "toolu_W1_write", file_path="src/login.test.tsx", content="it('submits once')"),
    )
    m.result("toolu_W1_write", "File created successfully at: src/login.test.tsx", timestamp=now())  # 16
    _asst(m, now, "msg_W1_05", tool("Bash", "toolu_W1_test", command="npm test"))  # 17
    m.result(
        "toolu_W1_test",
        "FAIL src/login.test.tsx",
        is_error=True,
        tur="Error: Exit code 1\nFAIL src/login.test.tsx",
        timestamp=now(),
    )  # 18
    m.obj(
        {
            "type": "file-history-snapshot",
            "messageId": "snap-w1b",
            "isSnapshotUpdate": True,
            "snapshot": {"messageId": "snap-w1b", "trackedFileBackups": {}, "timestamp": now()},
        }
    )  # 19
    m.obj({"type": "queue-operation", "operation": "dequeue", "timestamp": now(), "sessionId": W1})  # 20
    m.version = "2.0.76"  # the rewind happened after an update
    m.user("Ok in the future, run the linter first", parent=edit_result, timestamp=now())  # 21: back to line 12
    _asst(m, now, "msg_W1_06", tool("Bash", "toolu_W1_lint", command="npm run lint"))
    m.result("toolu_W1_lint", "0 problems", tur={"stdout": "0 problems", "stderr": ""}, timestamp=now())
    _asst(m, now, "msg_W1_07", text("Lint passes; the button is disabled while submitting."))
    m.obj({"type": "summary", "summary": "Login double submit", "leafUuid": m.last})
    m.write(d / f"{W1}.jsonl")
    a = Session(W1, "2.0.74", agent_id=SIB_AGENT, sidechain=True, new_uuid=new, cwd="/home/dev/webapp")
    a.user("Find every place that submits the login form", parent=None, timestamp=now())
    _asst(a, now, "msg_W1_sub_01", tool("Grep", "toolu_W1_sub_grep", pattern="onSubmit", output_mode="content"))
    a.result("toolu_W1_sub_grep", "src/login.tsx:1\nsrc/api.ts:40", timestamp=now())
    _asst(a, now, "msg_W1_sub_02", text("## Submit sites\n- src/login.tsx:1\n- src/api.ts:40"))
    a.write(d / f"agent-{SIB_AGENT}.jsonl")
    w = Session(W1, "2.0.74", agent_id=WARMUP_AGENT, sidechain=True, new_uuid=new, cwd="/home/dev/webapp")
    w.user("Warmup", parent=None, timestamp=now())  # a single record, no reply
    w.write(d / f"agent-{WARMUP_AGENT}.jsonl")
    only_summaries = Session(W2, "2.0.74", new_uuid=new)
    for i in range(3):
        only_summaries.obj({"type": "summary", "summary": f"Earlier work {i}", "leafUuid": f"elsewhere-{i}"})
    only_summaries.write(d / f"{W2}.jsonl")
    only_snapshots = Session(W3, "2.0.74", new_uuid=new)
    for i in range(2):
        only_snapshots.obj(
            {
                "type": "file-history-snapshot",
                "messageId": f"m{i}",
                "isSnapshotUpdate": bool(i),
                "snapshot": {"messageId": f"m{i}", "trackedFileBackups": {}, "timestamp": now()},
            }
        )
    only_snapshots.write(d / f"{W3}.jsonl")
    (d / f"{W4}.jsonl").write_bytes(b"")


def _legacy(root: Path, new) -> None:
    d = root / LEGACY
    now = _clock(400)
    cwd = "C:\\Users\\dev\\legacy"
    m = Session(L1, "1.0.98", new_uuid=new, cwd=cwd)
    m.obj({"type": "summary", "summary": "ORM migration planning", "leafUuid": "in-the-previous-file"})
    m.user("plan the migration to the new ORM", timestamp=now())
    e1 = _asst(
        m,
        now,
        "msg_L1_01",
        text("I'll split this across two agents."),
        tool("Task", "toolu_L1_task_models", description="models", prompt="List every model class"),
        tool("Task", "toolu_L1_task_sql", description="sql", prompt="List every raw SQL query"),
    )
    # two inline sidechains written into the same file, interleaved as they ran in parallel
    sa = Session(L1, "1.0.98", sidechain=True, new_uuid=new, cwd=cwd)
    sb = Session(L1, "1.0.98", sidechain=True, new_uuid=new, cwd=cwd)
    sa.lines = sb.lines = m.lines
    sa.user("List every model class", parent=None, timestamp=now())
    sb.user("List every raw SQL query", parent=None, timestamp=now())
    _asst(sa, now, "msg_L1_a1", tool("Grep", "toolu_L1_a_grep", pattern="class .*Model"))
    _asst(sb, now, "msg_L1_b1", tool("Grep", "toolu_L1_b_grep", pattern="execute\\("))
    sb.result(
        "toolu_L1_b_grep",
        [text("app/db.py:10: cursor.execute(q)"), text("app/report.py:3: execute(sql)")],
        timestamp=now(),
    )
    sa.result(
        "toolu_L1_a_grep", "app/models.py:1: class User(Model)\napp/models.py:9: class Order(Model)", timestamp=now()
    )
    _asst(sb, now, "msg_L1_b2", tool("Read", "toolu_L1_b_read", file_path="app/report.py"))
    _asst(sa, now, "msg_L1_a2", text("## Models\n- User\n- Order"))
    sb.result("toolu_L1_b_read", "def report(sql):\n    return execute(sql)\n", timestamp=now())
    _asst(sb, now, "msg_L1_b3", text("## Raw SQL\n- app/db.py:10\n- app/report.py:3"))
    m.result(
        "toolu_L1_task_models",
        [text("## Models\n- User\n- Order")],
        parent=e1[-1],
        tur={"content": [text("## Models\n- User\n- Order")], "totalDurationMs": 2000, "totalTokens": 900},
        timestamp=now(),
    )
    m.result(
        "toolu_L1_task_sql",
        [text("## Raw SQL\n- app/db.py:10\n- app/report.py:3")],
        tur={"content": [text("## Raw SQL")], "totalDurationMs": 2500, "totalTokens": 1100},
        timestamp=now(),
    )
    _asst(m, now, "msg_L1_02", tool("Write", "toolu_L1_write", file_path="PLAN.md", content="1. models\n2. raw SQL\n"))
    m.result("toolu_L1_write", "File created successfully at: PLAN.md", timestamp=now())
    m.user([text("[Request interrupted by user]")], timestamp=now())
    m.user("continue, but leave Order for later", timestamp=now())
    _asst(m, now, "msg_L1_03", text("Updated plan: User first; Order later."))
    m.write(d / f"{L1}.jsonl")

    r = Session(L2, "1.0.98", new_uuid=new, cwd=cwd)
    r.user(
        "<command-name>/clear</command-name>\n<command-message>clear</command-message>", isMeta=True, timestamp=now()
    )
    r.user("<local-command-stdout></local-command-stdout>", isMeta=True, timestamp=now())
    r.user("why is CI red?", timestamp=now())
    _asst(r, now, "msg_L2_01", tool("Bash", "toolu_L2_ci", command="gh run view --log-failed"))
    r.result(
        "toolu_L2_ci",
        "test_orm.py::test_user FAILED",
        tur={"stdout": "test_orm.py::test_user FAILED", "stderr": "", "interrupted": False},
        timestamp=now(),
    )
    _asst(r, now, "msg_L2_02", text("test_user fails on a missing migration."))
    r.version = "1.0.108"  # resumed under a newer version
    r.user("fix it", timestamp=now(back=120))  # written with a clock 2 minutes behind
    _asst(
        r,
        now,
        "msg_L2_03",
        tool("Edit", "toolu_L2_edit", file_path="migrations/0002.py", old_string="", new_string="x"),
    )
    r.result("toolu_L2_edit", "The file migrations/0002.py has been updated.", timestamp=now())
    _asst(r, now, "msg_L2_04", text("Added the missing migration."))
    r.write(d / f"{L2}.jsonl")


def write_corpus(root: Path) -> Path:
    """Write the corpus under ``root`` (created); returns ``root``. Same bytes on every call."""
    root = Path(root)
    new = _uuids("composer-pipeline-corpus")
    _toolsmith(root, new)
    _webapp(root, new)
    _legacy(root, new)
    return root
