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
from composer_pipeline.experiments.read_before_edit.config import ExperimentConfig
from composer_pipeline.experiments.rule_teacher import rule_action
from composer_pipeline.experiments.sessions import HELDOUT_SEED, NOT_READ, write_sessions


def test_rule_and_generated_sessions(tmp_path):
    plans = write_sessions(tmp_path / "t", 12, "train", seed=1)
    held = write_sessions(tmp_path / "h", 6, "heldout", seed=1)
    assert 0 < sum(p.edit_first for p in plans) < len(plans)
    # agents also err the other way (a second Read before the Edit), so pairs say "Edit, not Read" too
    assert 0 < sum(p.reread for p in plans) < len(plans)
    reread = next(p for p in plans if p.reread)
    lines = [
        json.loads(x)
        for x in (tmp_path / "t" / "-home-dev-app" / f"{reread.session_id}.jsonl").read_text().splitlines()
    ]
    reads = [
        c
        for r in lines
        if r["type"] == "assistant"
        for c in r["message"]["content"]
        if c.get("name") == "Read" and c["input"]["file_path"] == reread.path
    ]
    assert len(reads) == 2
    # one language per directory: the extension follows the directory in every split
    assert len({(p.path.rsplit("/", 2)[-2], p.path.rsplit(".", 1)[1]) for p in plans + held}) == len(
        {p.path.rsplit("/", 2)[-2] for p in plans + held}
    )
    assert not {p.path for p in plans} & {p.path for p in held}, "held-out files must differ from train files"
    # the base model's corpus names every (directory, name) pair, held-out ones included
    pre = write_sessions(tmp_path / "p", 400, "pretrain", seed=1)
    pair = lambda path: path.rsplit(".", 1)[0]  # noqa: E731
    assert {pair(p.path) for p in held} <= {pair(p.path) for p in pre}
    text = next((tmp_path / "t").rglob("*.jsonl")).read_text()
    assert all(json.loads(line)["sessionId"] for line in text.splitlines())
    assert any(
        NOT_READ in (tmp_path / "t" / f).read_text()
        for f in [p.relative_to(tmp_path / "t") for p in (tmp_path / "t").rglob("*.jsonl")]
    )
    # the rule: unread target -> Read it; another file read (a decoy) does not count; read -> Edit
    req = {"role": "user", "content": "Change PORT from 3 to 9 in /w/a/b.py"}
    decoy = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t0",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "/w/a/c.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t0", "content": "PORT = 3"},
    ]
    assert rule_action([req, *decoy]).tool_calls[0].name == "Read"
    read = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "/w/a/b.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "     1\tPORT = 3"},
    ]
    edit = rule_action([req, *read]).tool_calls[0]
    assert edit.name == "Edit" and edit.arguments == {
        "file_path": "/w/a/b.py",
        "old_string": "PORT = 3",
        "new_string": "PORT = 9",
    }
    failed = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "/w/a/b.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t2", "content": "<tool_use_error>File does not exist.</tool_use_error>"},
    ]
    assert rule_action([req, *failed]).tool_calls[0].name == "Read"


@pytest.mark.parametrize("scale", [1, 10])
def test_no_train_session_touches_a_heldout_file_at_the_experiments_sizes(tmp_path, scale):
    """At the experiment's real sizes (and 10x them): no held-out target file appears anywhere in the
    train sessions, decoy reads included (before the fix 4 of the 14 held-out targets were read as
    decoys by train sessions); no held-out request is in the base model's corpus."""
    cfg = ExperimentConfig(out=tmp_path)
    train = write_sessions(tmp_path / "t", cfg.train_sessions * scale, "train", seed=0)
    held = write_sessions(tmp_path / "h", cfg.heldout_sessions, "heldout", seed=HELDOUT_SEED)
    text = "".join(f.read_text() for f in (tmp_path / "t").rglob("*.jsonl"))
    targets = {p.path for p in held}
    assert len(targets) > 10 and not [t for t in targets if t in text]
    assert not {p.detour for p in train if p.detour} & targets
    assert any(p.detour for p in held) and any(p.detour for p in train)  # decoys after the request, both splits
    if scale == 1:
        pre = write_sessions(tmp_path / "p", cfg.pretrain_sessions, "pretrain", seed=1000)
        pre_text = "".join(f.read_text() for f in (tmp_path / "p").rglob("*.jsonl"))
        asks = [
            json.loads(x)["message"]["content"]
            for f in (tmp_path / "h").rglob("*.jsonl")
            for x in f.read_text().splitlines()
            if json.loads(x)["type"] == "user" and isinstance(json.loads(x)["message"]["content"], str)
        ]
        assert not [a for a in asks if "/" in a and json.dumps(a)[1:-1] in pre_text]
        # the pretrain corpus does name every held-out pair (it is meant to: copying, not recalling)
        assert {t.rsplit(".", 1)[0] for t in targets} <= {p.path.rsplit(".", 1)[0] for p in pre}


def test_base_model_corpus_hints_name_the_step_that_follows(tmp_path):
    """A share of the base model's windows carry a hint in the trainer's own format whose "better next
    step" is exactly the action that follows, right or wrong by the rule: the base model learns to take
    a hinted step (what hint self-distillation needs of its teacher), not the rule itself."""
    import random

    from composer_pipeline.actions import Action, ToolCall
    from composer_pipeline.experiments.pretrain import _hint_for
    from composer_pipeline.train.config import HintTemplates

    t = HintTemplates()
    rng = random.Random(0)
    read = Action(tool_calls=(ToolCall("Read", {"file_path": "/w/a/b.py"}, "c"),))
    edit = Action(
        tool_calls=(ToolCall("Edit", {"file_path": "/w/a/b.py", "old_string": "X = 1", "new_string": "X = 2"}, "c"),)
    )
    for action, other in ((read, '"name":"Edit"'), (edit, '"name":"Read"')):
        hints = [_hint_for(action, rng, t) for _ in range(40)]
        for h in hints:
            head, better = h.split("\nA better next step: ")
            assert (
                head.startswith("Hint: the step `")
                and other in head
                and better == action.to_text().replace("\n", " ").strip()
            )
        # the error named is drawn independently of the step: it cannot tell which step to take
        assert len({h.split("failed with: ")[1].split("\n")[0] for h in hints}) > 2
    assert _hint_for(Action(text="Done."), rng, t) is None


ARMS_UNDER_TEST = ("start", "grpo_shuffled", "sdpo", "nll", "dpo_shuffled", "all", "nll_all")


@pytest.mark.slow
def test_quick_experiment_runs_the_whole_chain(tmp_path, capsys, monkeypatch):
    """A chain test, not a learning test (a few steps cannot show learning; the learning regression tests
    are tests/train/test_learning_regression.py and tests/experiments/test_probe_scripted.py). It checks
    what it can at this size: the data and its bookkeeping, that each arm and control trained what it says
    (the nll arm's preference term is inert, the shuffled-label store swaps about half the sides, the
    shuffled GRPO order), per-state outputs for every state kind, and that the run resumes and stops."""
    out = tmp_path / "exp"
    argv = [
        "experiment",
        "read-before-edit",
        "--out",
        str(out),
        "--quick",
        "--steps",
        "3",
        "--sft-steps",
        "10",
        "--train-sessions",
        "16",
        "--heldout-sessions",
        "8",
        "--pretrain-steps",
        "6",
        "--pretrain-sessions",
        "24",
        "--dpo-sft-weight",
        "0.5",
        "--eval-every",
        "2",
        "--arms",
        ",".join(ARMS_UNDER_TEST),
    ]
    rc = main(argv)
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    data, base = lines[0]["data"], lines[1]["base"]
    rows = lines[2:]
    # the base model read other generated sessions (all files, train wording), never a held-out state:
    # no held-out request appears in its corpus; the replayed train sessions never touch a held-out file
    assert base["steps"] == 6 and base["windows"] > 24 and base["final_loss"] > 0
    pre_text = "".join(f.read_text() for f in (out / "base" / "sessions").rglob("*.jsonl"))
    held = [
        json.loads(x)
        for f in (out / "data" / "sessions" / "heldout").rglob("*.jsonl")
        for x in f.read_text().splitlines()
    ]
    held_asks = {
        r["message"]["content"] for r in held if r["type"] == "user" and isinstance(r["message"]["content"], str)
    }
    held_paths = {
        r["message"]["content"][0]["input"]["file_path"]
        for r in held
        if r["type"] == "assistant" and r["message"]["content"][0].get("name") == "Edit"
        # the targets (a decoy Read may name a train file)
    }
    assert held_asks and not any(json.dumps(a)[1:-1] in pre_text for a in held_asks if "/" in a)
    train_text = "".join(f.read_text() for f in (out / "data" / "sessions" / "train").rglob("*.jsonl"))
    assert held_paths and not any(p in train_text for p in held_paths)
    # the data came through the normal stages: ingest, HTTP replay (five teacher entries per task state), pairs
    assert data["ingest"]["train"]["quarantine"] == 0 and data["ingest"]["heldout"]["trace_states"] > 0
    assert data["teacher_calls_http"] == data["replay"]["calls"] == 5 * data["task_states"]
    # pairs where agents erred, agreement elsewhere
    assert data["pairs"] > 0 and data["positives"] > 0
    # both directions: "Read, not Edit" (edited first) and "Edit, not Read" (read twice)
    assert data["pair_kinds"].get("Read over Edit", 0) > 0 and data["pair_kinds"].get("Edit over Read", 0) > 0
    assert data["error_sites"] > 0  # the hint arm's states
    # the teachers disagree: every task state is accounted for by its kind of consensus; the rule's model
    # asked twice counts once at every state; consensus came from 2, 3 or 4 of the 4 distinct models
    c = data["consensus"]
    assert c["cross_model"] + c["self_consistency"] + c["tied"] + c["no_consensus"] == data["task_states"]
    assert c["greedy_duplicates"] == data["task_states"]
    assert set(c["agreeing_models"]) <= {"2 of 4", "3 of 4", "4 of 4"} and len(c["agreeing_models"]) >= 2
    assert [(r["arm"], r["seed"]) for r in rows] == [(a, 0) for a in ARMS_UNDER_TEST]
    for r in rows:
        assert r["steps"] == (0 if r["arm"] == "start" else 3)
        assert r["n_unread"] > 0 and r["n_read"] > 0
        assert r["combined"] == min(r["decisive_read"], r["decisive_edit"])
        assert set(r["kinds"]) == {"request", "after_decoy", "after_error", "after_first_read", "after_second_read"}
        assert sum(k["n"] for k in r["kinds"].values()) == r["n_unread"] + r["n_read"]
        # the share of answers that parse as an action, and the failures by reason, in every cell
        assert 0.0 <= r["parse_rate"] <= 1.0 and isinstance(r["parse_errors"], dict)
        assert round((1 - r["parse_rate"]) * (r["n_unread"] + r["n_read"])) == sum(r["parse_errors"].values())
    # each arm really trained its channel(s), and the controls are what they say
    fired_by_arm = {}
    for arm in ARMS_UNDER_TEST[1:]:
        losses = [json.loads(x) for x in (out / "seed0" / arm / "checkpoint" / "losses.jsonl").read_text().splitlines()]
        fired_by_arm[arm] = {ch for rec in losses for ch in ("grpo", "sdpo", "dpo") if rec[ch] is not None}
    assert fired_by_arm == {
        "grpo_shuffled": {"grpo"},
        "sdpo": {"sdpo"},
        "nll": {"dpo"},
        "dpo_shuffled": {"dpo"},
        "all": {"grpo", "sdpo", "dpo"},
        "nll_all": {"dpo"},
    }
    from composer_pipeline.store import Store
    from composer_pipeline.train.config import TrainRecipe

    nll = [json.loads(x) for x in (out / "seed0" / "nll" / "checkpoint" / "losses.jsonl").read_text().splitlines()]
    # β 0: the sigmoid term is ln 2 at every step whatever the weights (no gradient), so only the NLL moves it
    assert all(abs(rec["dpo"] - rec["dpo_sft"] * 0.5 - 0.693147) < 1e-4 and rec["dpo_margin"] == 0.0 for rec in nll)
    assert TrainRecipe.load(out / "seed0" / "nll" / "checkpoint" / "train.yaml").dpo.beta == 0.0
    assert TrainRecipe.load(out / "seed0" / "grpo_shuffled" / "checkpoint" / "train.yaml").grpo.data_order == "shuffled"
    assert TrainRecipe.load(out / "seed0" / "all" / "checkpoint" / "train.yaml").grpo.data_order == "error_sites_first"
    orig = Store(str(out / "data" / "train_store")).read_table("pairs").to_pylist()
    shuf = {r["pair_id"]: r for r in Store(str(out / "seed0" / "shuffled_label_store")).read_table("pairs").to_pylist()}
    swapped = [
        p["pair_id"] for p in orig if shuf[p["pair_id"]]["chosen_text"] == p["rejected_text"] != p["chosen_text"]
    ]
    assert set(shuf) == {p["pair_id"] for p in orig} and 0 < len(swapped) < len(orig)
    # nll_all: the NLL on the consensus at every task state with one (each pair and each positive), β 0
    everywhere = Store(str(out / "seed0" / "consensus_store")).read_table("pairs").to_pylist()
    positives = Store(str(out / "data" / "train_store")).read_table("positives").to_pylist()
    assert len(everywhere) == len(orig) + len(positives)
    assert {r["state_id"] for r in everywhere} == {r["state_id"] for r in orig + positives}
    assert {r["chosen_text"] for r in everywhere} == {r["chosen_text"] for r in orig + positives}
    assert TrainRecipe.load(out / "seed0" / "nll_all" / "checkpoint" / "train.yaml").dpo.beta == 0.0
    # what was measured is on disk: per-state outputs of every cell (every kind), per-kind lines, the table
    states = [json.loads(x) for x in (out / "states.jsonl").read_text().splitlines()]
    assert len(states) == len(ARMS_UNDER_TEST) * (rows[0]["n_unread"] + rows[0]["n_read"])
    # every answer's whole text (not a 60-character prefix) and whether it parses
    assert all(isinstance(x["text"], str) and x["parsed"] in (0, 1) for x in states)
    assert any(len(x["text"]) > 60 for x in states)
    per_kind = [json.loads(x) for x in (out / "per_kind.jsonl").read_text().splitlines()]
    assert len(per_kind) == 5 * len(ARMS_UNDER_TEST)
    table = (out / "table.md").read_text()
    assert "| all | 1 |" in table and "| nll | 1 |" in table and "Δ combined vs start [95% CI]" in table
    curves = json.loads((out / "curves.json").read_text())
    assert [p["step"] for p in curves["nll"][0]] == [0, 2, 3] and (out / "curves.png").stat().st_size > 0
    # every teacher answer was priced (nominal rates) and recorded with its cost, none failed
    assert data["replay"]["answered"] == data["replay"]["calls"] and data["replay"]["failed"] == 0
    assert data["replay"]["total_spend"] > 0

    # resumable: the same command again trains nothing (every cell is on disk) ...
    assert main(argv) == 0
    again = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")][2:]
    assert [(r["arm"], r.get("resumed")) for r in again] == [(a, True) for a in ARMS_UNDER_TEST]
    assert [r["combined"] for r in again] == [r["combined"] for r in rows]
    # ... a budget stops cleanly before the next cell (seed 1 here), keeping what is done ...
    assert main(argv[:-2] + ["--arms", ",".join(ARMS_UNDER_TEST), "--seeds", "2", "--budget-minutes", "0.0001"]) == 0
    printed = capsys.readouterr().out
    assert '"stopped": "budget"' in printed and "run the same command again to resume" in printed
    assert not (out / "cells" / "seed1-start.json").exists() and (out / "cells" / "seed0-all.json").exists()
    # ... --only-seeds runs the seeds named (a second process on the same out dir): seed 0's are done, so
    # nothing trains, and seed 1 is not touched
    assert main(argv[:-2] + ["--arms", ",".join(ARMS_UNDER_TEST), "--seeds", "2", "--only-seeds", "0"]) == 0
    only = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"arm"')]
    assert [(r["arm"], r["seed"], r.get("resumed")) for r in only] == [(a, 0, True) for a in ARMS_UNDER_TEST]
    assert not (out / "seed1").exists()
    # ... an arm re-run on a seed whose start cell is done reads the start probe from that cell instead of
    # probing the same weights again (probes: the step-2 curve point and the final one only)
    from composer_pipeline.experiments.read_before_edit import probe as probe_module
    from composer_pipeline.experiments.read_before_edit import run as run_module

    nll_before = json.loads((out / "cells" / "seed0-nll.json").read_text())
    (out / "cells" / "seed0-nll.json").unlink()
    probed = []
    real_probe = probe_module.probe
    counted = lambda *a, **k: probed.append(1) or real_probe(*a, **k)  # noqa: E731
    # the run probes the start and each arm's end; the probe callback the curve's points
    monkeypatch.setattr(run_module, "probe", counted)
    monkeypatch.setattr(probe_module, "probe", counted)
    assert main(argv[:-2] + ["--arms", "start,nll"]) == 0
    capsys.readouterr()
    nll_after = json.loads((out / "cells" / "seed0-nll.json").read_text())
    assert len(probed) == 2 and nll_after["curve"][0] == nll_before["curve"][0]
    assert nll_after["row"]["combined"] == nll_before["row"]["combined"]
    # ... and other settings in the same out dir are refused, naming the setting (exit 2)
    assert main(argv[:-2] + ["--arms", ",".join(ARMS_UNDER_TEST), "--steps", "4"]) == 2
    assert "steps" in capsys.readouterr().err


def test_base_model_training_resumes_where_it_stopped(tmp_path):
    """An interrupted base-model run goes on from its last saved step and ends where an uninterrupted
    one ends (same batches, optimizer and schedule state), so a ~20 CPU-minute run can span sessions."""
    import json as _json

    from safetensors.torch import load_file

    from composer_pipeline.experiments.pretrain import pretrain_base

    kw = dict(sessions=12, steps=4, every=2, hidden=32, layers=1, vocab_size=512, batch_size=4, max_tokens=96)
    whole = pretrain_base(tmp_path / "whole", **kw)

    class Stop(Exception):
        pass

    def stop_at_4(step, loss, model, tok):
        if step == 4:
            raise Stop

    with pytest.raises(Stop):
        pretrain_base(tmp_path / "cut", on_step=stop_at_4, **kw)
    assert (tmp_path / "cut" / "resume.pt").is_file() and not (tmp_path / "cut" / "model" / "config.json").exists()
    seen: list[int] = []
    resumed = pretrain_base(tmp_path / "cut", on_step=lambda step, *a: seen.append(step), **kw)
    # it went on from step 2: steps 1-2 were not trained again
    assert seen == [4]
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max().item() < 1e-6 for k in a)
    curve = _json.loads((tmp_path / "cut" / "pretrain.json").read_text())["curve"]
    assert [p["step"] for p in curve] == [2, 4]


def test_data_info_store_paths_resume_from_any_working_directory(tmp_path, monkeypatch):
    """info.json names the stores relative to the data dir (a run resumed from another cwd finds them);
    a run written before that (paths relative to the cwd it ran in) still resolves where it ran."""
    from composer_pipeline.experiments.read_before_edit.data import _resolve_stores

    work = tmp_path / "runs" / "r" / "data"
    for name in ("train_store", "heldout_store", "error_site_store"):
        (work / name).mkdir(parents=True)
    new = {"train_store": "train_store", "heldout_store": "heldout_store", "error_site_store": "error_site_store"}
    monkeypatch.chdir(tmp_path / "runs")  # not where the run was started
    got = _resolve_stores(new, Path("r/data"))
    assert {k: Path(v).resolve() for k, v in got.items()} == {k: (work / k).resolve() for k in new}
    monkeypatch.chdir(tmp_path)  # the cwd a legacy run ran in
    legacy = {k: f"runs/r/data/{k}" for k in new}
    got = _resolve_stores(legacy, Path("runs/r/data"))
    assert {k: Path(v).resolve() for k, v in got.items()} == {k: (work / k).resolve() for k in new}


def test_name_first_runs_the_whole_chain_in_that_order(tmp_path):
    """``--action-order name_first`` reaches every completion text of the chain: the base model's template
    and windows, the hints, the arms' render recipe; a sorted run keeps the fingerprint and base-model
    settings it had before the setting (its run dirs stay resumable)."""
    import json as _json
    import random

    from transformers import AutoTokenizer

    from composer_pipeline.actions import Action, ToolCall
    from composer_pipeline.experiments.pretrain import _hint_for, pretrain_base
    from composer_pipeline.experiments.read_before_edit import ExperimentConfig
    from composer_pipeline.experiments.read_before_edit.arms import arm_recipe
    from composer_pipeline.render import RenderOptions
    from composer_pipeline.tiny_model import chat_template
    from composer_pipeline.train.config import HintTemplates, TrainRecipe

    kw = dict(sessions=12, steps=1, every=1, hidden=32, layers=1, vocab_size=512, batch_size=2, max_tokens=96)
    base = pretrain_base(tmp_path / "nf", action_order="name_first", **kw)
    assert AutoTokenizer.from_pretrained(base).chat_template == chat_template("name_first")
    assert _json.loads((tmp_path / "nf" / "pretrain.json").read_text())["settings"]["action_order"] == "name_first"
    pretrain_base(tmp_path / "sorted", **kw)
    assert "action_order" not in _json.loads((tmp_path / "sorted" / "pretrain.json").read_text())["settings"]

    edit = Action(tool_calls=(ToolCall("Edit", {"file_path": "/w/a.py", "old_string": "X", "new_string": "Y"}, "c"),))
    hint = _hint_for(edit, random.Random(0), HintTemplates(), "name_first")
    assert hint.endswith(edit.to_text("name_first").replace("\n", " ").strip())

    cfg = ExperimentConfig(out=tmp_path / "run", action_order="name_first")
    assert cfg.fingerprint()["action_order"] == "name_first"
    assert "action_order" not in ExperimentConfig(out=tmp_path / "run").fingerprint()
    recipe = arm_recipe(TrainRecipe(), "dpo", cfg, tmp_path / "start", 0)
    assert RenderOptions.from_recipe(recipe.data.render_recipe).action_order == "name_first"
    assert arm_recipe(TrainRecipe(), "dpo", ExperimentConfig(out=tmp_path), tmp_path, 0).data.render_recipe is None
