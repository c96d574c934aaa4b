"""``composer-pipeline workspace verify``: one line per file-tool call of the stored states."""

from __future__ import annotations

import json

import pytest

from composer_pipeline.cli import main


def test_verify_prints_one_line_per_file_tool_state_with_prediction_and_observation(file_tool_store, capsys):
    assert main(["workspace", "verify", "--store", file_tool_store, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(set(r) == {"state_id", "tool", "predicted_ok", "observed_ok", "reason"} for r in rows)
    got = [(r["tool"], r["predicted_ok"], r["observed_ok"]) for r in rows]
    assert got == [
        ("Read", None, True),  # never seen: cannot tell
        ("Edit", True, True),  # read before, old_string once
        ("Edit", False, False),  # not read
        ("Read", None, False),  # not yet known missing
        ("Read", False, False),  # known missing now
    ]
    assert len({r["state_id"] for r in rows}) == 5


def test_verify_summary_and_clear_error(file_tool_store, capsys, tmp_path):
    assert main(["workspace", "verify", "--store", file_tool_store]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{") :])
    assert summary["file_tool_calls"] == 5 and summary["with_verdict"] == 3 and summary["agreement"] == 1.0
    assert summary["observed_failures"] == 3 and summary["failures_predicted"] == 2
    assert main(["workspace", "verify", "--store", str(tmp_path)]) == 2
    assert "no trace_states table" in capsys.readouterr().err


def test_workspace_without_its_subcommand_names_it(capsys):
    with pytest.raises(SystemExit) as e:
        main(["workspace"])
    assert e.value.code == 2 and "verify" in capsys.readouterr().err


def test_an_inline_subagent_starts_in_the_sessions_shell_not_in_its_records_cwd(tmp_path, capsys):
    """Claude Code 1.0.x writes an inline subagent's records when it ends, each with the shell's cwd of that
    moment; the shell it ran in started where the session's main records say."""
    from tests.support.sessions import Session, text, tool

    sid = "0000aaaa-0000-4000-8000-000000000002"
    m = Session(sid=sid, version="1.0.98", cwd="/home/u/p")
    m.user("build it")
    m.assistant(tool("Task", "k1", description="make lib", prompt="make lib"), timestamp="2026-01-01T00:00:01.000Z")
    side = Session(sid=sid, version="1.0.98", sidechain=True, cwd="/home/u/p/app")  # cwd at its end, not start
    side.user("make lib", parent=None, timestamp="2026-01-01T00:00:02.000Z")
    empty = "total 0\ndrwxr-xr-x 2 u s 64 Jan 1 00:00 .\ndrwxr-xr-x 3 u s 96 Jan 1 00:00 .."
    calls = [
        (tool("Bash", "s1", command="ls -la"), empty, None),
        (tool("Bash", "s2", command="mkdir -p lib"), "", None),
        (tool("Write", "s3", file_path="/home/u/p/lib/a.py", content="x = 1"),
         "File created successfully at: /home/u/p/lib/a.py", {"type": "create", "filePath": "/home/u/p/lib/a.py"}),
    ]  # fmt: skip
    for i, (call, out, tur) in enumerate(calls):
        side.assistant(call, timestamp=f"2026-01-01T00:00:{3 + 2 * i:02d}.000Z")
        side.result(call["id"], out, tur=tur, timestamp=f"2026-01-01T00:00:{4 + 2 * i:02d}.000Z")
    side.assistant(text("made"), timestamp="2026-01-01T00:00:20.000Z")
    m.lines += side.lines
    m.result("k1", "made", timestamp="2026-01-01T00:00:21.000Z")
    m.assistant(text("done"), timestamp="2026-01-01T00:00:22.000Z")
    m.write(tmp_path / "traces" / "proj" / f"{sid}.jsonl")
    assert main(["ingest", str(tmp_path / "traces"), "--out", str(tmp_path / "store")]) == 0
    capsys.readouterr()
    assert main(["workspace", "verify", "--store", str(tmp_path / "store"), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["tool"], r["predicted_ok"], r["observed_ok"]) for r in rows] == [("Write", True, True)]


def test_a_task_whose_subagent_is_stored_acts_only_through_the_subagents_calls(tmp_path, capsys):
    from tests.support.sessions import Session, text, tool

    sid = "0000aaaa-0000-4000-8000-000000000003"
    f = "/home/u/p/app.py"
    m = Session(sid=sid, version="1.0.98", cwd="/home/u/p")
    m.user("tidy app.py")
    m.assistant(tool("Read", "r1", file_path=f), timestamp="2026-01-01T00:00:01.000Z")
    tur = {"type": "text", "file": {"filePath": f, "content": "a = 1", "numLines": 1, "startLine": 1, "totalLines": 1}}
    m.result("r1", "     1→a = 1", tur=tur, timestamp="2026-01-01T00:00:02.000Z")
    m.assistant(tool("Task", "k1", description="look", prompt="look around"), timestamp="2026-01-01T00:00:03.000Z")
    side = Session(sid=sid, version="1.0.98", sidechain=True, cwd="/home/u/p")
    side.user("look around", parent=None, timestamp="2026-01-01T00:00:04.000Z")
    side.assistant(tool("Grep", "g1", pattern="a", path="/home/u/p"), timestamp="2026-01-01T00:00:05.000Z")
    side.result("g1", f"Found 1 file\n{f}", timestamp="2026-01-01T00:00:06.000Z")
    side.assistant(text("one file"), timestamp="2026-01-01T00:00:07.000Z")
    m.lines += side.lines
    m.result("k1", "one file", timestamp="2026-01-01T00:00:08.000Z")
    edit = tool("Edit", "e1", file_path=f, old_string="a = 1", new_string="a = 2")
    m.assistant(edit, timestamp="2026-01-01T00:00:09.000Z")
    m.result("e1", f"The file {f} has been updated.", tur={"filePath": f}, timestamp="2026-01-01T00:00:10.000Z")
    m.write(tmp_path / "traces" / "proj" / f"{sid}.jsonl")
    assert main(["ingest", str(tmp_path / "traces"), "--out", str(tmp_path / "store")]) == 0
    capsys.readouterr()
    assert main(["workspace", "verify", "--store", str(tmp_path / "store"), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # the Task is not an unknown writer: app.py's text is still known, the Edit applies
    assert [(r["tool"], r["predicted_ok"]) for r in rows if r["tool"] == "Edit"] == [("Edit", True)]


def test_a_parallel_subagent_sees_another_subagents_task_end_as_no_write(tmp_path, capsys):
    from tests.support.sessions import Session, text, tool

    sid = "0000aaaa-0000-4000-8000-000000000004"
    f = "/home/u/p/b.py"
    m = Session(sid=sid, version="1.0.98", cwd="/home/u/p")
    m.user("two jobs")
    m.assistant(tool("Task", "k1", description="one", prompt="job one"), timestamp="2026-01-01T00:00:01.000Z")
    m.assistant(tool("Task", "k2", description="two", prompt="job two"), timestamp="2026-01-01T00:00:01.500Z")
    a = Session(sid=sid, version="1.0.98", sidechain=True, cwd="/home/u/p")
    a.user("job one", parent=None, timestamp="2026-01-01T00:00:02.000Z")
    a.assistant(text("nothing to do"), timestamp="2026-01-01T00:00:03.000Z")
    b = Session(sid=sid, version="1.0.98", sidechain=True, cwd="/home/u/p")
    b.user("job two", parent=None, timestamp="2026-01-01T00:00:02.000Z")
    b.assistant(tool("Read", "r1", file_path=f), timestamp="2026-01-01T00:00:04.000Z")
    tur = {"type": "text", "file": {"filePath": f, "content": "b = 1", "numLines": 1, "startLine": 1, "totalLines": 1}}
    b.result("r1", "     1→b = 1", tur=tur, timestamp="2026-01-01T00:00:05.000Z")
    b.assistant(
        tool("Edit", "e1", file_path=f, old_string="b = 1", new_string="b = 2"), timestamp="2026-01-01T00:00:09Z"
    )
    b.result("e1", f"The file {f} has been updated.", tur={"filePath": f}, timestamp="2026-01-01T00:00:10.000Z")
    b.assistant(text("done two"), timestamp="2026-01-01T00:00:11.000Z")
    m.lines += a.lines + b.lines
    m.result("k1", "nothing to do", timestamp="2026-01-01T00:00:06.000Z")  # job one ends before job two's Edit
    m.result("k2", "done two", timestamp="2026-01-01T00:00:12.000Z")
    m.assistant(text("done"), timestamp="2026-01-01T00:00:13.000Z")
    m.write(tmp_path / "traces" / "proj" / f"{sid}.jsonl")
    assert main(["ingest", str(tmp_path / "traces"), "--out", str(tmp_path / "store")]) == 0
    capsys.readouterr()
    assert main(["workspace", "verify", "--store", str(tmp_path / "store"), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    edits = [(r["tool"], r["predicted_ok"], r["reason"]) for r in rows if r["tool"] == "Edit"]
    # 1.0.x inline subagents' read state is not relied on, but the known text is: not a "full text" unknown
    assert edits == [("Edit", None, edits[0][2])] and "1.0.x" in edits[0][2]


def test_a_compaction_clears_read_state_and_restores_only_some_files(tmp_path, capsys):
    """Claude Code empties the agent's read state when it compacts the conversation and re-reads only some recent
    files into it (1.0.x: the compaction function deletes every readFileState key, then restores recent files;
    2.x: createPostCompactFileAttachments, a bounded number within a token budget): a file read before the boundary may or may not
    still count as read (cannot tell), a file read again after it does, a file never read still fails."""
    from tests.support.sessions import Session, tool

    sid = "0000aaaa-0000-4000-8000-000000000005"
    d = "/home/u/p"
    m = Session(sid=sid, version="2.0.74", cwd=d)
    m.user("tidy")
    for i, name in enumerate(("a.py", "b.py")):
        f = f"{d}/{name}"
        tur = {"type": "text", "file": {"filePath": f, "content": "x = 1", "numLines": 1, "startLine": 1,
                                        "totalLines": 1}}  # fmt: skip
        m.assistant(tool("Read", f"r{i}", file_path=f), timestamp=f"2026-01-01T00:00:0{2 * i}.000Z")
        m.result(f"r{i}", "     1→x = 1", tur=tur, timestamp=f"2026-01-01T00:00:0{2 * i + 1}.000Z")
    before = m.last
    m.rec("system", parent=None, subtype="compact_boundary", content="Conversation compacted", logicalParentUuid=before,
          compactMetadata={"trigger": "auto", "preTokens": 160000}, timestamp="2026-01-01T00:01:00.000Z")  # fmt: skip
    m.user("This session is being continued from a previous conversation...", isCompactSummary=True,
           isVisibleInTranscriptOnly=True, timestamp="2026-01-01T00:01:01.000Z")  # fmt: skip
    tur = {"type": "text", "file": {"filePath": f"{d}/b.py", "content": "x = 1", "numLines": 1, "startLine": 1,
                                    "totalLines": 1}}  # fmt: skip
    m.assistant(tool("Read", "r9", file_path=f"{d}/b.py"), timestamp="2026-01-01T00:01:02.000Z")
    m.result("r9", "     1→x = 1", tur=tur, timestamp="2026-01-01T00:01:03.000Z")
    not_read = "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>"
    for i, name in enumerate(("a.py", "b.py", "c.py")):
        f = f"{d}/{name}"
        m.assistant(tool("Edit", f"e{i}", file_path=f, old_string="x = 1", new_string="x = 2"),
                    timestamp=f"2026-01-01T00:01:1{2 * i}.000Z")  # fmt: skip
        ok = name != "c.py"
        m.result(f"e{i}", f"The file {f} has been updated." if ok else not_read, is_error=None if ok else True,
                 tur={"filePath": f} if ok else "Error: " + not_read[16:-17],
                 timestamp=f"2026-01-01T00:01:1{2 * i + 1}.000Z")  # fmt: skip
    m.write(tmp_path / "traces" / "proj" / f"{sid}.jsonl")
    assert main(["ingest", str(tmp_path / "traces"), "--out", str(tmp_path / "store")]) == 0
    capsys.readouterr()
    assert main(["workspace", "verify", "--store", str(tmp_path / "store"), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    edits = [(r["predicted_ok"], r["reason"]) for r in rows if r["tool"] == "Edit"]
    assert edits[0][0] is None and "compact" in edits[0][1]  # a.py: read only before the boundary
    assert edits[1][0] is True  # b.py: read again after it
    # c.py: never read (its existence is shown by nothing: fails either way)
    assert edits[2][0] is False
