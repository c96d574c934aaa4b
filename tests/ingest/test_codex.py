"""Codex CLI rollouts: detection, one state per assistant step, answered prefixes, secrets, quarantine, keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from composer_pipeline.actions import Action
from composer_pipeline.ingest import codex, files, native
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.ingest.partition_keys import candidates
from composer_pipeline.ingest.pipeline import ingest_session
from composer_pipeline.render import INTERRUPTED, Conversation, render_state
from tests.support.sessions import Session, text

from . import codex_fixtures as fx

GENERATIONS = list(fx.GENERATIONS)


def _ingest(root, **kw):
    (sf,) = discover_sessions(root)
    return ingest_session(sf, **kw)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_every_assistant_step_becomes_a_codex_state(tmp_path, generation):
    fx.write(tmp_path, generation)
    res = _ingest(tmp_path)
    states = res.states.to_pylist()
    assert len(states) == fx.STEPS[generation]
    (report,) = res.file_reports
    assert report["source"] == "codex" and report["generation"] == generation and report["states"] == len(states)
    assert report["assistant_steps"] == len(states) and res.quarantine.num_rows == 0
    for name in ("states", "messages"):
        assert set(getattr(res, name).column("source").to_pylist()) == {"codex"}
    assert {s["session_id"] for s in states} == {fx.SESSION_IDS[generation]}
    assert candidates(res.session_key)[0] == "codex/" + fx.SESSION_IDS[generation][:8]
    # every message row is a line of the file (lineage), in order
    lines = (tmp_path / states[0]["source_file"]).read_text().splitlines()
    rows = res.messages.to_pylist()
    assert len(rows) == len(lines)
    for row in rows:
        if "[REDACTED:" not in row["raw"]:
            assert row["raw"] == lines[row["line_no"] - 1]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_every_call_in_a_prefix_is_answered_by_its_output(tmp_path, generation):
    fx.write(tmp_path, generation)
    res = _ingest(tmp_path)
    conv = Conversation.from_table(res.messages)
    last = res.states.to_pylist()[-1]
    rendered = render_state(conv, last)
    msgs = rendered.messages
    calls = [c for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answers = {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}
    assert calls, msgs
    for c in calls:
        assert answers[c["id"]] not in ("", INTERRUPTED), c
    assert {t["function"]["name"] for t in rendered.tools} >= {c["function"]["name"] for c in calls}
    # the count stored at ingest is the rendered prefix's
    for st in res.states.to_pylist():
        assert st["n_prefix_messages"] == len(render_state(conv, st).messages), st["state_id"]


def test_error_sites_and_actions_per_generation(tmp_path):
    got = {}
    for g in GENERATIONS:
        root = tmp_path / g
        fx.write(root, g)
        got[g] = _ingest(root).states.to_pylist()
    early, shell, exec_ = got["early"], got["shell"], got["exec"]
    # early: exit_code 1 of the first shell call is an error site; the second call succeeded
    assert [s["has_error"] for s in early] == [True, False, False]
    assert json.loads(early[0]["error_after"])[0]["content"] == "1 failed, 3 passed"
    first = Action.from_json(early[0]["action"])
    assert first.tool_calls[0].name == "shell" and first.tool_calls[0].arguments["command"][:2] == ["bash", "-lc"]
    # shell: two parallel calls are one step; the second exited 2
    step = Action.from_json(shell[0]["action"])
    assert [c.id for c in step.tool_calls] == ["call_s1", "call_s2"] and shell[0]["has_error"]
    assert [e["tool_use_id"] for e in json.loads(shell[0]["error_after"])] == ["call_s2"]
    assert shell[0]["model"] == "gpt-5-codex" and shell[0]["version"] == "0.39.0"
    assert json.loads(shell[0]["usage"]) == {"input_tokens": 900, "output_tokens": 40}
    assert Action.from_json(shell[1]["action"]).text.startswith("The deploy was denied")
    # exec: exec_command (cmd), apply_patch as a custom call, a plain-text "Process exited with code 1"
    names = [Action.from_json(s["action"]).tool_calls[0].name for s in exec_[:3]]
    assert names == ["exec_command", "apply_patch", "exec_command"]
    assert [s["has_error"] for s in exec_] == [False, False, True, False]
    assert "*** Begin Patch" in Action.from_json(exec_[1]["action"]).tool_calls[0].arguments["input"]


def test_a_compaction_restarts_the_prefix_from_what_it_kept(tmp_path):
    fx.write(tmp_path, "exec")
    res = _ingest(tmp_path)
    conv = Conversation.from_table(res.messages)
    after = res.states.to_pylist()[2]  # the publish call, after the compaction
    msgs = render_state(conv, after).messages
    assert [m["role"] for m in msgs[1:3]] == ["user", "assistant"]  # the kept messages, each with its role
    assert msgs[2]["content"] == "Summary: VERSION now says 1.5.0; publishing is next."
    # the compacted-away history is not in the prefix
    assert "cat VERSION" not in json.dumps(msgs)
    assert res.file_reports[0]["compactions_crossed"] == 1


@pytest.mark.parametrize("generation", GENERATIONS)
def test_planted_keys_reach_no_parquet_column(tmp_path, generation):
    fx.write(tmp_path / "in", generation)
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    total = json.loads(p.stdout.splitlines()[-1])
    assert total["states"] == fx.STEPS[generation]
    assert total["secrets_scrubbed"].get("url_credentials") == 1
    dumped = ""
    for name in ("trace_states", "trace_messages", "quarantine"):
        dumped += json.dumps(pq.read_table(tmp_path / "out" / f"{name}.parquet").to_pylist(), default=str)
    assert "[REDACTED:" in dumped
    for key in fx.PLANTED:
        assert key not in dumped, key
    for key in fx.PLANTED:
        assert key not in p.stdout


def test_a_file_in_neither_format_is_a_quarantine_row_not_silence(tmp_path):
    (tmp_path / "other.jsonl").write_text(json.dumps({"role": "user", "text": "hi from another agent"}) + "\n")
    res = _ingest(tmp_path)
    assert res.states.num_rows == 0
    (row,) = res.quarantine.to_pylist()
    assert row["reason"] == codex.NOT_A_SESSION and row["line_no"] == 0 and row["source"] is None
    assert res.file_reports[0]["bad_lines"] == 1


@pytest.mark.parametrize("value", [[], {"a": 1}])
def test_a_first_line_whose_type_is_not_a_string_is_no_crash(value):
    """A damaged first line (the native engine's fuzzer writes one) holding a list or object ``type``:
    told from its other keys, or by the lines after it (a list is no set member: it raised TypeError)."""
    first = json.dumps({"type": value, "summary": "Earlier work"}).encode()
    assert files.detect_format(first + b"\n" + json.dumps({"type": "user", "uuid": "u-1"}).encode()) == "claude"
    assert files.detect_format(json.dumps({"type": value, "leafUuid": "x"}).encode()) == "claude"
    assert files.detect_format(first) is None


def test_the_format_is_told_from_the_first_64_kib_only():
    """Only the head is read (in place: it was a 64 KiB copy of every main file): a line cut by its end is
    not parsed, and a head of whitespace only is Claude Code's, whatever follows it."""
    rollout = json.dumps({"timestamp": "x", "type": "session_meta", "payload": {"id": "r-1"}}).encode()
    claude = json.dumps({"type": "user", "uuid": "u-1"}).encode()
    assert files.detect_format(rollout + b"\n" + claude) == "codex"
    assert files.detect_format(b" " * (files.DETECT_BYTES - 8) + b"\n" + rollout) == "claude"
    assert files.detect_format(b"\n" * (files.DETECT_BYTES - len(rollout)) + rollout) == "codex"
    assert files.detect_format(b"\n" * (files.DETECT_BYTES - len(rollout) + 1) + rollout) == "claude"
    assert files.detect_format(b" \t\r\n" * files.DETECT_BYTES + rollout) == "claude"
    assert files.detect_format(b"") == "claude"


@pytest.mark.parametrize("value", [[], {"a": 1}])
def test_a_rollout_line_whose_type_is_not_a_string_is_a_quarantine_row(tmp_path, value):
    """A damaged line inside a rollout, its own ``type`` or its payload's a list or an object: one quarantine
    row (a list is no set member: it raised TypeError and ended the whole ingest run)."""
    path = fx.write(tmp_path, "shell")
    lines = path.read_text().splitlines()
    bad_line = json.dumps({"timestamp": "x", "type": value, "payload": {"type": "message"}})
    bad_item = json.dumps({"timestamp": "x", "type": "response_item", "payload": {"type": value}})
    bare = json.dumps({"timestamp": "x", "type": value})
    path.write_text("\n".join(lines[:3] + [bad_line, bad_item, bare] + lines[3:]) + "\n")
    res = _ingest(tmp_path)
    assert res.states.num_rows == fx.STEPS["shell"]
    reasons = {r["line_no"]: r["reason"] for r in res.quarantine.to_pylist()}
    assert reasons[4] == codex.NOT_A_ROLLOUT_LINE
    assert 5 not in reasons or reasons[5] == codex.NOT_A_ROLLOUT_LINE
    assert reasons[6] == codex.NOT_A_ROLLOUT_LINE


def test_source_override_and_a_bad_line(tmp_path):
    path = fx.write(tmp_path, "shell")
    lines = path.read_text().splitlines()
    path.write_text(
        "\n".join(lines[:3] + ['{"timestamp": "x", "type": "response_item", "pay', "[1, 2]"] + lines[3:]) + "\n"
    )
    res = _ingest(tmp_path)
    assert res.states.num_rows == fx.STEPS["shell"]
    reasons = {r["line_no"]: r["reason"] for r in res.quarantine.to_pylist()}
    assert reasons[4].startswith("invalid JSON") and reasons[5] == "not a JSON object"
    assert set(res.quarantine.column("source").to_pylist()) == {"codex"}
    # forced to Claude Code: read as Claude Code (nothing of it is a Claude record), source says so
    forced = _ingest(tmp_path, source="claude")
    assert forced.states.num_rows == 0 and set(forced.messages.column("source").to_pylist()) <= {"claude"}
    # a Claude Code session forced to Codex: every line is quarantined as not a rollout line
    claude_root = tmp_path / "claude"
    claude = Session()
    claude.user("hi")
    claude.assistant(text("hello"))
    claude.write(claude_root / "p" / "s.jsonl")
    assert _ingest(claude_root).states.column("source").to_pylist() == ["claude"]
    as_codex = _ingest(claude_root, source="codex")
    assert as_codex.states.num_rows == 0
    assert {r["reason"] for r in as_codex.quarantine.to_pylist()} == {codex.NOT_A_ROLLOUT_LINE}


@pytest.mark.parametrize("generation", GENERATIONS)
def test_buffer_built_tables_equal_pyarrows_own_conversion(tmp_path, generation):
    """codex.table_of (no pandas import) builds what pa.array would, nulls and lists included."""
    from composer_pipeline.ingest.pipeline import to_table

    path = fx.write(tmp_path, generation)
    build = codex.read_rollout(path.read_bytes() + b"not json\n", "r.jsonl", "k", 50)
    qcols = {k: [r[k] for r in build.quarantine] for k in build.quarantine[0]}
    for name, cols in (("trace_states", build.states), ("trace_messages", build.messages), ("quarantine", qcols)):
        got = codex.table_of(name, cols)
        got.validate(full=True)
        assert got.equals(to_table(name, cols)), name


@pytest.mark.parametrize("engine", ["python", "native"] if native.AVAILABLE else ["python"])
def test_claude_and_codex_sessions_in_one_run_keep_session_order(tmp_path, engine):
    from composer_pipeline.ingest.pipeline import SessionIngester

    for name in ("a", "c"):
        s = Session()
        s.user(f"hi {name}")
        s.assistant(text("hello"))
        s.write(tmp_path / "claude" / name / "s.jsonl")
    fx.write(tmp_path / "codex", "shell")
    sessions = discover_sessions(tmp_path / "claude")
    sessions.insert(1, *discover_sessions(tmp_path / "codex"))
    ing = SessionIngester(engine=engine)
    for sf in sessions:
        ing.add(sf)
    assert ing.pending_rows() > 0
    states = ing.take()["trace_states"]
    keys = list(dict.fromkeys(states.column("session_key").to_pylist()))
    assert keys == [sf.key for sf in sessions]
    assert states.column("source").to_pylist() == ["claude"] + ["codex"] * fx.STEPS["shell"] + ["claude"]


def test_a_line_type_newer_than_the_reader_is_kept_not_quarantined(tmp_path):
    """Newer cli versions add line types (``world_state``, ...): kept as rows for lineage, never rendered."""
    lines = fx.exec_()
    lines.insert(5, json.dumps({"timestamp": "2026-03-04T08:00:05Z", "type": "future_kind", "payload": {"x": 1}}))
    fx.write(tmp_path, "exec", lines)
    res = _ingest(tmp_path)
    assert res.quarantine.num_rows == 0 and res.states.num_rows == fx.STEPS["exec"]
    assert "future_kind" in res.messages.column("record_type").to_pylist()


def test_a_failed_command_of_a_script_call_is_an_error_site(tmp_path):
    """Code mode (cli >= 0.15x, seen in a real 0.153.4 rollout): the script's output says nothing of exit
    codes; the ``item_completed`` event of its second command says it exited 2. That call is an error site."""
    fx.write(tmp_path, "exec", fx.code_mode())
    res = _ingest(tmp_path)
    first, last = res.states.to_pylist()
    assert first["has_error"] and not last["has_error"]
    (error,) = json.loads(first["error_after"])
    assert error["tool_use_id"] == "call_e1" and error["tool_name"] == "exec"
    assert "rg -n TODO web" in error["content"] and "exit code 2" in error["content"]


def test_an_mcp_output_stored_as_a_json_string_of_content_items_renders_as_its_text(tmp_path):
    """Seen in a real early (Sep 2025) rollout: an MCP call's ``output`` is ``'[{"text": ..., "type": "text"}]'``
    as a string. The prefix shows the tool's text, not that JSON with its escapes."""
    fx.write(tmp_path, "early", fx.mcp_output())
    res = _ingest(tmp_path)
    conv = Conversation.from_table(res.messages)
    last = res.states.to_pylist()[-1]
    (tool,) = [m for m in render_state(conv, last).messages if m["role"] == "tool"]
    assert tool["tool_call_id"] == "call_m1"
    assert json.loads(tool["content"]) == {"data": {"nextTask": {"id": "7.2", "title": "Write the scanner docs"}}}
    assert not last["has_error"]


def test_a_compaction_keeps_each_kept_message_with_its_role(tmp_path):
    """A real 0.104 compaction keeps 30+ messages (prompts and final answers); the prefix after it has them
    as user and assistant messages, not one user message holding them all."""
    fx.write(tmp_path, "exec", fx.kept_history())
    res = _ingest(tmp_path)
    conv = Conversation.from_table(res.messages)
    states = res.states.to_pylist()
    assert len(states) == 3 and res.file_reports[0]["compactions_crossed"] == 1
    msgs = render_state(conv, states[1]).messages  # the first step after the compaction
    assert [(m["role"], m["content"]) for m in msgs[1:]] == [
        ("user", "add a dark mode"),
        ("assistant", "Dark mode is in: a toggle in the header."),
        ("user", "the toggle overlaps\n\n[image]"),
    ]
    for st in states:
        assert st["n_prefix_messages"] == len(render_state(conv, st).messages)
