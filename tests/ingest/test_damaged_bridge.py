"""A line cut off before its uuid does not cut the history: the next record is bridged through it.

The same session is written twice: intact, and with lines cut mid-write (the main file and a
subagent file; with the damaged line's ``parentUuid`` readable, and cut so early that it is not).
Every state must keep the prefix it has in the intact session (less the cut record's own message,
which is gone), in both engines, and each file's report counts its bridges.
"""

from __future__ import annotations

import json
from pathlib import Path

from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.render import Conversation, RenderOptions, render_state

from composer_pipeline.testing.sessions import Session, text, tool
from .engines import ingest_checked

SID = "b41d6e00-0000-4000-8000-000000000001"
LOST = "LOST-USER-MESSAGE"  # the text of the one cut record that renders (a user message)


def _write(root: Path) -> dict[str, list[int]]:
    """Main file + 2.1.x subagent file, intact under ``root/a`` and with four lines cut before their uuid
    under ``root/b``; returns the cut line numbers per file name."""
    m = Session(SID)
    cuts_main: list[tuple[int, int | None]] = []  # (line index, cut length or None: just before "uuid")
    m.user("fix the parser")
    m.assistant(text("looking"), tool("Read", "r1", file_path="a.py"))
    m.result("r1", "file text")
    m.rec("progress", data={"type": "hook_progress"})
    cuts_main.append((len(m.lines) - 1, None))  # parentUuid readable: salvaged
    m.assistant(text("next"), tool("Task", "task1", prompt="explore", description="d"))
    m.result("task1", "explored", tur={"agentId": "ag1", "status": "completed"})
    m.user(f"{LOST}: also check b.py")
    cuts_main.append((len(m.lines) - 1, None))
    m.assistant(tool("Bash", "b1", command="ls"))
    m.rec("attachment", attachment={"type": "file"})
    cuts_main.append((len(m.lines) - 1, 20))  # cut inside parentUuid: nothing salvaged, nearest record used
    m.result("b1", "a.py b.py")
    m.assistant(text("done"))
    a = Session(SID, agent_id="ag1", sidechain=True)
    a.user("explore", parent=None)
    a.assistant(text("reading"), tool("Grep", "g1", pattern="x"))
    a.rec("progress", data={"type": "hook_progress"})
    cuts_agent = [(len(a.lines) - 1, None)]
    a.result("g1", "found")
    a.assistant(text("agent done"))
    for sub in ("a", "b"):
        m.write(root / sub / "proj" / f"{SID}.jsonl")
        a.write(root / sub / "proj" / SID / "subagents" / "agent-ag1.jsonl")
        for sess, cuts in ((m, cuts_main), (a, cuts_agent)) if sub == "a" else ():
            for i, n in cuts:
                line = sess.lines[i]
                sess.lines[i] = line[:n] if n else line[: line.index('"uuid"')]
    return {f"{SID}.jsonl": [i + 1 for i, _ in cuts_main], "agent-ag1.jsonl": [i + 1 for i, _ in cuts_agent]}


def _ingest(root: Path):
    (sf,) = discover_sessions(root)
    return ingest_checked(sf)


def _prefixes(res) -> dict[str, list[dict]]:
    conv = Conversation.from_table(res.messages)
    return {st["state_id"]: render_state(conv, st, RenderOptions()).messages for st in res.states.to_pylist()}


def test_every_state_keeps_its_prefix_through_cut_lines(tmp_path):
    cut_lines = _write(tmp_path)
    intact, damaged = _ingest(tmp_path / "a"), _ingest(tmp_path / "b")
    good, got = _prefixes(intact), _prefixes(damaged)
    assert list(got) == list(good) and len(good) == 6
    lost = [m for p in good.values() for m in p if LOST in json.dumps(m)]
    assert lost
    changed = 0
    for sid, prefix in good.items():
        want = [m for m in prefix if LOST not in json.dumps(m)]
        assert got[sid] == want, sid
        changed += want != prefix
    assert changed == 2  # the two states after the lost user message
    n_good = {s["state_id"]: s["n_prefix_messages"] for s in intact.states.to_pylist()}
    for st in damaged.states.to_pylist():
        assert st["n_prefix_messages"] == len(got[st["state_id"]]) <= n_good[st["state_id"]]
    # reports: one bridge per cut line, the cut lines quarantined, none salvaged a uuid
    rep = {r["file"].rsplit("/", 1)[-1]: r for r in damaged.file_reports}
    assert {name: r["damaged_bridged"] for name, r in rep.items()} == {name: len(c) for name, c in cut_lines.items()}
    assert damaged.stats["damaged_bridged"] == 4 and intact.stats["damaged_bridged"] == 0
    q = damaged.quarantine.to_pylist()
    assert len(q) == 4 and all(r["salvaged_uuid"] is None for r in q)
    assert sum(r["salvaged_parent_uuid"] is not None for r in q) == 3
    # the bridge is a pass-through message row at the damaged line, under the uuid its child names
    bridges = [r for r in damaged.messages.to_pylist() if r["record_type"] == "damaged"]
    assert {(r["source_file"].rsplit("/", 1)[-1], r["line_no"]) for r in bridges} == {
        (name, n) for name, lines in cut_lines.items() for n in lines}
    intact_rows = {(r["source_file"], r["line_no"]): r for r in intact.messages.to_pylist()}
    for b in bridges:
        orig = intact_rows[(b["source_file"], b["line_no"])]
        assert b["uuid"] == orig["uuid"] and b["parent_uuid"] == orig["parent_uuid"]


def test_an_unknown_parent_with_no_damaged_line_before_it_is_left_alone(tmp_path):
    """A record naming a parent outside the file (a resumed session) with no cut line before it is not
    bridged; a cut line after it does not bridge it either."""
    m = Session(SID)
    m.user("continued", parent="00000000-0000-4000-8000-0000000aaaaa")
    m.assistant(text("ok"))
    m.raw('{"parentUuid":"%s","type":"user","message":{"role":"user","content":"cut' % m.last)
    m.write(tmp_path / "proj" / f"{SID}.jsonl")
    res = _ingest(tmp_path)
    assert res.file_reports[0]["damaged_bridged"] == 0 and res.quarantine.num_rows == 1
    assert [r["record_type"] for r in res.messages.to_pylist()] == ["user", "assistant"]
