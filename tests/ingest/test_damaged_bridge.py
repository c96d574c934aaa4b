"""A line cut off before its uuid does not cut the history: the next record is bridged through it.

The same session is written twice: intact, and with lines cut mid-write (the main file and a
subagent file; with the damaged line's ``parentUuid`` readable, and cut so early that it is not).
Every state must keep the prefix it has in the intact session (less the cut record's own message,
which is gone), in both engines, and each file's report counts its bridges. Then chains of 2 and 3
damaged lines in a row (tests/ingest/damage.py damages them and writes the repaired twin to compare
with), and tool results salvaged from damaged lines.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.render import INTERRUPTED, Conversation, RenderOptions, render_state
from composer_pipeline.salvage import SALVAGED_MARK, SALVAGED_RESULTS, salvaged_tool_results
from tests.support.sessions import Session, text, tool

from .damage import damage_files, masked, prefixes
from .engines import ingest_checked

SID = "b41d6e00-0000-4000-8000-000000000001"
# the text of the one cut record that renders (a user message)
LOST = "LOST-USER-MESSAGE"


def _write(root: Path) -> dict[str, list[int]]:
    """Main file + 2.1.x subagent file, intact under ``root/a`` and with four lines cut before their uuid
    under ``root/b``; returns the cut line numbers per file name."""
    m = Session(SID)
    # (line index, cut length or None: just before "uuid")
    cuts_main: list[tuple[int, int | None]] = []
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
    # cut inside parentUuid: nothing salvaged, nearest record used
    cuts_main.append((len(m.lines) - 1, 20))
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
    # the two states after the lost user message
    assert changed == 2
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
        (name, n) for name, lines in cut_lines.items() for n in lines
    }
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


# ---- chains of damaged lines in a row (issue #25) ---------------------------------------------------------
CHAINS = [
    ("cut_late", "cut_late"),
    ("cut_early", "cut_late"),
    ("garbled_parent", "cut_late"),
    ("missing_parent", "cut_early"),
    ("cut_late", "garbled_parent"),
    ("garbled_body", "missing_parent"),
    ("cut_late", "cut_late", "cut_late"),
    ("cut_early", "cut_late", "cut_late"),
    ("garbled_parent", "cut_late", "missing_parent"),
    ("missing_parent", "garbled_parent", "cut_early"),
    ("cut_late", "garbled_body", "garbled_parent"),
    ("garbled_body", "garbled_body", "garbled_body"),
]


def _chain_corpus(src: Path) -> dict[str, list[int]]:
    """A 1.0.x main file with two inline sidechains (parallel Task calls) and a 2.1.x agent file;
    returns, per file, the 0-based line indexes where the damaged runs start."""
    m = Session(SID, "1.0.98")
    m.user("fix the parser")
    m.assistant(text("looking"), tool("Read", "r1", file_path="a.py"))
    m.result("r1", "file text")
    m.assistant(tool("Task", "t1", prompt="one", description="d"), tool("Task", "t2", prompt="two", description="d"))
    ids = iter(range(1, 10**6))
    s1, s2 = (
        Session(SID, "1.0.98", sidechain=True, new_uuid=lambda: "%08x-0000-4000-8000-000000000000" % next(ids))
        for _ in range(2)
        # (distinct first 8 characters: a sidechain's stream id is side-<root[:8]>)
    )
    s1.user("one", parent=None)
    s2.user("two", parent=None)
    for k in range(4):
        for s, tag in ((s1, "x"), (s2, "y")):
            s.assistant(text(f"{tag}{k}"), tool("Grep", f"g{tag}{k}", pattern=tag), mid=f"msg_{tag}{k}")
            s.result(f"g{tag}{k}", f"found {tag}{k}")
    side_starts = [len(m.lines) + 4, len(m.lines) + len(s1.lines) + 6]  # inside each sidechain
    # one sidechain after the other, as 1.0.x writes them
    m.lines += s1.lines + s2.lines
    m.result("t1", "done one")
    m.result("t2", "done two")
    main_start = len(m.lines)
    m.user("also check b.py")
    m.assistant(text("next"), tool("Bash", "b1", command="ls"))
    m.result("b1", "a.py b.py")
    m.assistant(text("then"), tool("Bash", "b2", command="pwd"))
    m.result("b2", "/home/u/p")
    m.assistant(text("done"))
    m.write(src / "proj" / f"{SID}.jsonl")
    a = Session(SID, agent_id="ag1", sidechain=True)
    a.user("explore", parent=None)
    for k in range(4):
        a.assistant(text(f"step {k}"), tool("Grep", f"ga{k}", pattern="z"))
        a.result(f"ga{k}", f"hit {k}")
    a.assistant(text("agent done"))
    a.write(src / "proj" / SID / "subagents" / "agent-ag1.jsonl")
    return {f"proj/{SID}.jsonl": [*side_starts, main_start], f"proj/{SID}/subagents/agent-ag1.jsonl": [3]}


@pytest.mark.parametrize("modes", CHAINS, ids=["+".join(c) for c in CHAINS])
def test_chains_of_damaged_lines_keep_every_prefix(tmp_path, modes):
    """2 and 3 damaged lines in a row (parents cut, garbled or missing; uuids cut or readable), in the
    main conversation, in two inline sidechains and in an agent file: every state keeps the
    prefix of the repaired session (the damaged lines' own messages gone, all else kept), both engines."""
    starts = _chain_corpus(tmp_path / "src")
    picks = {rel: {i + k: mode for i in at for k, mode in enumerate(modes)} for rel, at in starts.items()}
    v = damage_files(tmp_path / "src", tmp_path / "out", picks, random.Random(len(modes) * 31 + len(modes[0])))
    assert {rel: len(lines) for rel, lines in v.lines.items()} == {
        rel: len(modes) * len(at) for rel, at in starts.items()
    }  # every line of every run damaged
    want, got = prefixes(v.repaired, _checked), prefixes(v.damaged, _checked)
    assert len(want) >= 14 and set(got) == set(want)
    wrong = [k for k in want if masked(got[k], v.results) != masked(want[k], v.results)]
    assert not wrong, wrong
    # (the main conversation's last states: long histories)
    assert max(len(p) for p in want.values()) >= 8


def _checked(sf):
    return ingest_checked(sf)


def test_a_garbled_flag_does_not_move_a_damaged_record_to_another_stream(tmp_path):
    """A damaged record whose ``isSidechain`` is unreadable takes the latest record's flag: its
    sidechain children stay in their stream (no new stream, same state ids as the repaired session)."""
    starts = _chain_corpus(tmp_path / "src")
    rel = f"proj/{SID}.jsonl"
    lines = (tmp_path / "src" / rel).read_text().splitlines()
    i = starts[rel][1] + 2
    assert '"isSidechain": true' in lines[i]
    lines[i] = lines[i].replace('"isSidechain": true', '"isSide"chain": true')
    (tmp_path / "src" / rel).write_text("".join(x + "\n" for x in lines))
    (sf,) = discover_sessions(tmp_path / "src")
    res = ingest_checked(sf)
    assert len({s["stream_id"] for s in res.states.to_pylist()}) == 4  # main, two sidechains, the agent
    (damaged,) = [r for r in res.messages.to_pylist() if r["record_type"] == "damaged"]
    assert damaged["is_sidechain"] is True and damaged["parent_uuid"] is not None


# ---- tool results salvaged from damaged lines ----------------------------------------------------------------
def test_tool_results_are_salvaged_from_damaged_lines(tmp_path):
    """A result line cut mid-content (uuid lost: bridged), one cut inside a block list, and one garbled
    at its end (uuid readable) answer their calls with what they still hold, marked salvaged; a call
    whose result is truly absent stays ``[interrupted: no result]``. Both engines."""
    long_out = 'line one\n\tline "two" \u00e9\n' + "x" * 300
    m = Session(SID)
    m.user("go")
    m.assistant(text("reading"), tool("Read", "r1", file_path="a.py"), tool("Bash", "b1", command="ls"))
    m.result("r1", long_out)
    cut_string = len(m.lines) - 1
    m.result("b1", [{"type": "text", "text": "first block"}, {"type": "text", "text": "second block is long"}])
    cut_list = len(m.lines) - 1
    m.assistant(tool("Grep", "g1", pattern="x"))
    m.result("g1", "grep hit")
    garbled = len(m.lines) - 1
    m.assistant(tool("Bash", "b2", command="sleep 100"))
    m.user("[Request interrupted by user for tool use]")
    m.assistant(text("done"))
    lines = m.lines
    at = lines[cut_string].index("x" * 50)
    # cut inside the content string (uuid lost)
    lines[cut_string] = lines[cut_string][: at + 10]
    lines[cut_list] = lines[cut_list][: lines[cut_list].index("is long")]  # cut inside the second block
    # not JSON any more; uuid and parent readable
    lines[garbled] = lines[garbled].rstrip("}")
    m.write(tmp_path / "proj" / f"{SID}.jsonl")
    res = _ingest(tmp_path)
    assert res.quarantine.num_rows == 3
    rows = [r for r in res.messages.to_pylist() if r["record_type"] == "damaged"]
    assert [r["subtype"] for r in rows] == [SALVAGED_RESULTS] * 3
    conv = Conversation.from_table(res.messages)
    last = res.states.to_pylist()[-1]
    tools = {t["tool_call_id"]: t["content"] for t in render_state(conv, last).messages if t["role"] == "tool"}
    assert tools == {
        "r1": f"{SALVAGED_MARK}\n{long_out[: long_out.index('x') + 10]}",
        "b1": f"{SALVAGED_MARK}\nfirst block\nsecond block ",
        "g1": f"{SALVAGED_MARK}\ngrep hit",
        "b2": INTERRUPTED,
    }
    # a state before a salvaged line does not see it (answered as interrupted, as an intact line would be)
    first = render_state(conv, res.states.to_pylist()[0]).messages
    assert [t["content"] for t in first if t["role"] == "tool"] == []
    second = render_state(conv, res.states.to_pylist()[1]).messages
    assert [t["content"] for t in second if t["role"] == "tool"] == [tools["r1"], tools["b1"]]


def test_salvaged_text_reading():
    assert salvaged_tool_results('{"x":1,"tool_use_id":"t1","content":"a\\nb\\u00e9\\ud83d') == [("t1", "a\nb\u00e9?")]
    assert salvaged_tool_results('{"tool_use_id":"t1","content":"ab\\u00') == [("t1", "ab")]  # a cut escape
    assert salvaged_tool_results('{"tool_use_id":"t1","content":"ab\\') == [("t1", "ab")]
    assert salvaged_tool_results('{"tool_use_id":"t1","content":"ab\\\\') == [("t1", "ab\\")]  # an escaped backslash
    assert salvaged_tool_results('{"tool_use_id":"t1","content":"ab\\qcd"}') == [("t1", "ab")]  # garbled escape
    assert salvaged_tool_results('{"tool_use_id":"t1","content":"ab"[REDACTED cd"}') == [("t1", "ab")]
    assert salvaged_tool_results('{"tool_use_id":"t1","content":"a\x01\\u00e9') == [("t1", "a\x01\u00e9")]
    assert salvaged_tool_results(
        '{"tool_use_id":"t1","content":"done"},{"tool_use_id":"t2","content":[{"type":"text"'
        ',"text":"p1"},{"type":"image"},{"type":"text","text":"p2'
    ) == [("t1", "done"), ("t2", "p1\np2")]
    assert salvaged_tool_results('{"tool_use_id":"t1","is_error":tr') == []  # no content: nothing to salvage
    assert salvaged_tool_results('{"tool_use_id":"t') == []  # the id itself cut
    assert salvaged_tool_results('{"content":"\\"tool_use_id\\": \\"t9\\", \\"content\\": \\"x') == []  # quoted text
