"""Pairs and lineage on ingested Claude Code sessions (a project of each corpus: ours; the real one when
named), replays built per schema."""

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from composer_pipeline import tables
from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.cli import main
from composer_pipeline.ingest.pipeline import ingest_paths
from composer_pipeline.store import Store

from .conftest import replay

OTHER = Action(tool_calls=(ToolCall("Read", {"file_path": "/nonexistent/NOTES.md"}),))


def test_sessions_pair_and_trace_back_to_their_lines(corpus, tmp_path, capsys):
    root = corpus.root / corpus.expect["pairs_subdir"]
    results = list(ingest_paths([root]))
    states = pa.concat_tables([r.states for r in results])
    messages = pa.concat_tables([r.messages for r in results])
    assert states.num_rows > 5
    rows, expect_pairs = [], set()
    for i, st in enumerate(states.to_pylist()):
        agent = Action.from_json(st["action"])
        if agent.is_empty:
            continue
        disagree = i % 3 != 0
        for t in ("alpha", "beta"):
            rows.append(dict(replay(st["state_id"], t, OTHER if disagree else agent), session_key=st["session_key"]))
        rows.append(dict(replay(st["state_id"], "gamma", agent), session_key=st["session_key"]))
        if disagree:
            expect_pairs.add(st["state_id"])
    out = Store(str(tmp_path / "run"))
    out.write_table("trace_states", states)
    out.write_table("trace_messages", messages)
    out.write_table("replays", pa.Table.from_pylist(rows, schema=tables.TEACHER_REPLAYS))

    capsys.readouterr()
    assert main(["pairs", "--replays", out.root, "--states", out.root, "--out", out.root]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    built = out.read_table("dpo_pairs")
    assert set(built.column("state_id").to_pylist()) == expect_pairs
    assert summary["pairs"] + sum(summary["dropped_by_op"].values()) == len(expect_pairs)
    assert summary["positives"] > 0

    for pid in built.column("pair_id").to_pylist()[:4]:
        capsys.readouterr()
        assert main(["lineage", pid, "--store", out.root, "--json"]) == 0
        chain = orjson.loads(capsys.readouterr().out)
        assert chain["missing"] == [] and chain["records"]
        lines = (root / chain["session"]["source_file"]).read_text().splitlines()  # relative to the ingest root
        for rec in chain["records"]:
            original = orjson.loads(lines[rec["line_no"] - 1])
            stored = orjson.loads(rec["raw"])
            assert stored["uuid"] == original["uuid"] == rec["uuid"] and rec["uuid_matches"]
            assert stored["type"] == "assistant"
        prompt = orjson.loads(built.filter(pc.equal(built["pair_id"], pid))["prompt"][0].as_py())
        assert prompt[0]["role"] == "system" and len(prompt) >= 2
