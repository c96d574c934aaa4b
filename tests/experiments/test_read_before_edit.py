"""The read-before-edit experiment in a small quick form: the whole chain on generated sessions.

Generated Claude Code JSONL -> the normal ingest -> replay over real HTTP (rule teachers on loopback,
priced, ledgered) -> pairs/hints -> the tiny base model trained from scratch on other generated
sessions -> a start policy fitted to the agents -> the five arms through the normal trainer ->
held-out probes. At these sizes (a few steps) it checks the chain and its bookkeeping, not that a
policy learns: bench/RESULTS.md has the learning run.
"""

import json
from pathlib import Path

import pytest

from composer_pipeline.cli import main
from composer_pipeline.experiments.rule_teacher import rule_action
from composer_pipeline.experiments.sessions import NOT_READ, write_sessions


def test_rule_and_generated_sessions(tmp_path):
    plans = write_sessions(tmp_path / "t", 12, "train", seed=1)
    held = write_sessions(tmp_path / "h", 6, "heldout", seed=1)
    assert 0 < sum(p.edit_first for p in plans) < len(plans)
    # agents also err the other way (a second Read before the Edit), so pairs say "Edit, not Read" too
    assert 0 < sum(p.reread for p in plans) < len(plans)
    reread = next(p for p in plans if p.reread)
    lines = [json.loads(x) for x in (tmp_path / "t" / "-home-dev-app" / f"{reread.session_id}.jsonl").read_text().splitlines()]
    reads = [c for r in lines if r["type"] == "assistant" for c in r["message"]["content"]
             if c.get("name") == "Read" and c["input"]["file_path"] == reread.path]
    assert len(reads) == 2
    # one language per directory: the extension follows the directory in every split
    assert len({(p.path.rsplit("/", 2)[-2], p.path.rsplit(".", 1)[1]) for p in plans + held}) == len({p.path.rsplit("/", 2)[-2] for p in plans + held})
    assert not {p.path for p in plans} & {p.path for p in held}, "held-out files must differ from train files"
    # the base model's corpus names every (directory, name) pair, held-out ones included
    pre = write_sessions(tmp_path / "p", 400, "pretrain", seed=1)
    pair = lambda path: path.rsplit(".", 1)[0]  # noqa: E731
    assert {pair(p.path) for p in held} <= {pair(p.path) for p in pre}
    text = next((tmp_path / "t").rglob("*.jsonl")).read_text()
    assert all(json.loads(line)["sessionId"] for line in text.splitlines())
    assert any(NOT_READ in (tmp_path / "t" / f).read_text() for f in [p.relative_to(tmp_path / "t") for p in (tmp_path / "t").rglob("*.jsonl")])
    # the rule: unread target -> Read it; another file read (a decoy) does not count; read -> Edit
    req = {"role": "user", "content": "Change PORT from 3 to 9 in /w/a/b.py"}
    decoy = [{"role": "assistant", "content": None, "tool_calls": [{"id": "t0", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "/w/a/c.py"}'}}]},
             {"role": "tool", "tool_call_id": "t0", "content": "PORT = 3"}]
    assert rule_action([req, *decoy]).tool_calls[0].name == "Read"
    read = [{"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "/w/a/b.py"}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "     1\tPORT = 3"}]
    edit = rule_action([req, *read]).tool_calls[0]
    assert edit.name == "Edit" and edit.arguments == {"file_path": "/w/a/b.py", "old_string": "PORT = 3", "new_string": "PORT = 9"}
    failed = [{"role": "assistant", "content": None, "tool_calls": [{"id": "t2", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "/w/a/b.py"}'}}]},
              {"role": "tool", "tool_call_id": "t2", "content": "<tool_use_error>File does not exist.</tool_use_error>"}]
    assert rule_action([req, *failed]).tool_calls[0].name == "Read"


def test_base_model_corpus_hints_name_the_step_that_follows(tmp_path):
    """A share of the base model's windows carry a hint in the trainer's own format whose "better next
    step" is exactly the action that follows, right or wrong by the rule: the base model learns to take
    a hinted step (what hint self-distillation needs of its teacher), not the rule itself."""
    import random

    from composer_pipeline.actions import Action, ToolCall
    from composer_pipeline.experiments.pretrain import _hint_for
    from composer_pipeline.train.hints import HintTemplates

    t = HintTemplates()
    rng = random.Random(0)
    read = Action(tool_calls=(ToolCall("Read", {"file_path": "/w/a/b.py"}, "c"),))
    edit = Action(tool_calls=(ToolCall("Edit", {"file_path": "/w/a/b.py", "old_string": "X = 1", "new_string": "X = 2"}, "c"),))
    for action, other in ((read, '"name":"Edit"'), (edit, '"name":"Read"')):
        hints = [_hint_for(action, rng, t) for _ in range(40)]
        for h in hints:
            head, better = h.split("\nA better next step: ")
            assert head.startswith("Hint: the step `") and other in head and better == action.to_text().replace("\n", " ").strip()
        # the error named is drawn independently of the step: it cannot tell which step to take
        assert len({h.split("failed with: ")[1].split("\n")[0] for h in hints}) > 2
    assert _hint_for(Action(text="Done."), rng, t) is None


def test_quick_experiment_runs_the_whole_chain(tmp_path, capsys):
    out = tmp_path / "exp"
    rc = main(["experiment", "read-before-edit", "--out", str(out), "--quick", "--steps", "3", "--sft-steps", "30",
               "--train-sessions", "16", "--heldout-sessions", "6", "--pretrain-steps", "20", "--pretrain-sessions", "24",
               "--dpo-sft-weight", "0.5"])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    data, base = lines[0]["data"], lines[1]["base"]
    rows = lines[2:]
    # the base model read other generated sessions (all files, train wording), never a held-out state:
    # no held-out request appears in its corpus; the replayed train sessions never touch a held-out file
    assert base["steps"] == 20 and base["windows"] > 24 and base["final_loss"] > 0
    pre_text = "".join(f.read_text() for f in (out / "base" / "sessions").rglob("*.jsonl"))
    held = [json.loads(x) for f in (out / "data" / "sessions" / "heldout").rglob("*.jsonl") for x in f.read_text().splitlines()]
    held_asks = {r["message"]["content"] for r in held if r["type"] == "user" and isinstance(r["message"]["content"], str)}
    held_paths = {r["message"]["content"][0]["input"]["file_path"] for r in held
                  if r["type"] == "assistant" and r["message"]["content"][0].get("name") == "Edit"}  # the targets (a decoy Read may name a train file)
    assert held_asks and not any(json.dumps(a)[1:-1] in pre_text for a in held_asks if "/" in a)
    train_text = "".join(f.read_text() for f in (out / "data" / "sessions" / "train").rglob("*.jsonl"))
    assert held_paths and not any(p in train_text for p in held_paths)
    # the data came through the normal stages: ingest, HTTP replay (two teachers per task state), pairs
    assert data["ingest"]["train"]["quarantine"] == 0 and data["ingest"]["heldout"]["trace_states"] > 0
    assert data["teacher_calls_http"] == data["replay"]["calls"] == 2 * data["task_states"]
    assert data["pairs"] > 0 and data["positives"] > 0  # pairs where agents erred, agreement elsewhere
    # both directions: "Read, not Edit" (edited first) and "Edit, not Read" (read twice)
    assert data["pair_kinds"].get("Read over Edit", 0) > 0 and data["pair_kinds"].get("Edit over Read", 0) > 0
    assert data["error_sites"] > 0  # the hint arm's states
    assert [(r["arm"], r["seed"]) for r in rows] == [(a, 0) for a in ("start", "grpo", "sdpo", "dpo", "all")]
    for r in rows:
        assert {"arm", "seed", "read_when_unread", "edit_when_read", "steps", "seconds"} <= r.keys()
        assert 0.0 <= r["read_when_unread"] <= 1.0 and 0.0 <= r["edit_when_read"] <= 1.0
        assert r["n_unread"] > 0 and r["n_read"] > 0
        assert r["steps"] == (0 if r["arm"] == "start" else 3)
    for arm in ("grpo", "sdpo", "dpo", "all"):  # each arm really trained its channel(s)
        losses = [json.loads(x) for x in (out / "seed0" / arm / "checkpoint" / "losses.jsonl").read_text().splitlines()]
        fired = {ch for rec in losses for ch in ("grpo", "sdpo", "dpo") if rec[ch] is not None}
        assert fired == ({"grpo", "sdpo", "dpo"} if arm == "all" else {arm}), (arm, fired)
    # the arms' recipes: the hint teacher is the frozen start policy; DPO carries the NLL term asked for
    from composer_pipeline.train.config import TrainRecipe

    dpo_recipe = TrainRecipe.load(out / "seed0" / "dpo" / "checkpoint" / "train.yaml")
    assert dpo_recipe.dpo.sft_weight == 0.5 and dpo_recipe.sdpo.teacher == "initial"
    dpo_losses = [json.loads(x) for x in (out / "seed0" / "dpo" / "checkpoint" / "losses.jsonl").read_text().splitlines()]
    assert all(rec["dpo_sft"] > 0 for rec in dpo_losses)
    curves = json.loads((out / "curves.json").read_text())
    assert [p["step"] for p in curves["dpo"][0]] == [0, 3]
    assert (out / "curves.png").stat().st_size > 0 and "| all | 1 |" in (out / "table.md").read_text()
    # every teacher answer was priced (nominal rates) and recorded with its cost, none failed
    assert data["replay"]["answered"] == data["replay"]["calls"] and data["replay"]["failed"] == 0
    assert data["replay"]["total_spend"] > 0
