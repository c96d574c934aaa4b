"""``composer-pipeline train`` with two DiLoCo replica groups on this machine (gloo, the tiny model),
one of them killed with SIGKILL after the first outer step: restarted by the command, healed from
the live group through torchft's recovery, rejoined, and the run still exits 0 with one checkpoint.
And a group that cannot come back is dropped with its reason while the other one finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
import yaml

from tests.support.synthetic_train import write_store

pytestmark = pytest.mark.slow  # two training processes and a restart


def _recipe(root: Path, tiny_model_dir: Path, repo_root: Path, **diloco) -> Path:
    raw = yaml.safe_load((repo_root / "recipes" / "train.yaml").read_text())
    raw["model"] = str(tiny_model_dir)
    raw["optim"].update(steps=8, learning_rate=1e-3)
    raw["grpo"]["max_completion_length"] = 8
    raw["diloco"].update(replica_groups=2, inner_steps=2, timeout_s=15, **diloco)
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _train(data: str, recipe: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "composer_pipeline", "train", "--data", data, "--recipe", str(recipe)]
    return subprocess.Popen(
        [*cmd, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_a_group_killed_after_the_first_outer_step_heals_and_rejoins(tmp_path, tiny_model_dir, repo_root):
    data = write_store(tmp_path / "data", 16)
    recipe = _recipe(tmp_path, tiny_model_dir, repo_root, rejoin_timeout_s=120)
    out = tmp_path / "out"
    proc = _train(data, recipe, out)
    lines, listed, killed = [], [], None
    try:
        for raw in proc.stdout:
            if not raw.startswith('{"step"'):
                continue
            rec = json.loads(raw)
            lines.append(rec)
            replicas = json.loads((out / "replicas.json").read_text())
            listed.append(replicas)
            if killed is None and rec["group"] == 1 and rec["outer_step"] >= 1:
                pids = {g["group"]: g["pid"] for g in replicas["groups"]}
                assert set(pids) == {0, 1} and os.getpid() not in pids.values()
                killed = pids[1]
                os.kill(killed, signal.SIGKILL)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert rc == 0, err[-3000:]
    assert killed is not None, "group 1 never reached its first outer step"

    # replicas.json listed both live groups, and group 1 under a new pid after its restart
    pids_of_1 = {g["pid"] for r in listed for g in r["groups"] if g["group"] == 1}
    assert killed in pids_of_1 and len(pids_of_1) == 2, listed

    metrics = json.loads((out / "checkpoint" / "metrics.json").read_text())
    dl = metrics["diloco"]
    kinds = [(e["event"], e["group"]) for e in dl["events"]]
    assert kinds == [("lost", 1), ("restarted", 1), ("rejoined", 1)], dl["events"]
    assert dl["events"][0]["exit_code"] == -signal.SIGKILL
    assert dl["groups_finished"] == [0, 1] and dl["groups_dropped"] == []
    assert dl["outer_steps"] == dl["outer_steps_planned"] == 4
    # the healed group ends on the survivor's weights
    assert dl["groups_max_weight_diff"] < 1e-6
    # the step log: outer steps advance, the healed group's lines say so, and both groups train to the end
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert max(r["outer_step"] for r in steps) >= 2
    assert any(r["group"] == 1 and r["healed"] and r["replica_groups_live"] == 2 for r in steps)
    assert {r["replica_groups_live"] for r in steps} <= {None, 1, 2}
    assert sorted(p.name for p in out.iterdir() if (p / "model.safetensors").exists()) == ["checkpoint"]
    assert json.loads((out / "replicas.json").read_text()) == {"groups": []}  # nothing live after the run


def _supervise(tmp_path: Path, group_code: dict[int, str], **diloco):
    """The launcher's supervision loop over real processes that play groups (``group_code``: Python source)."""
    from composer_pipeline.train.config import DiLoCoSection
    from composer_pipeline.train.diloco_launch import Launch

    d = DiLoCoSection(replica_groups=len(group_code), **diloco)
    starts: list[tuple[int, bool]] = []

    def command(g: int, must_heal: bool) -> list[str]:
        starts.append((g, must_heal))
        return [sys.executable, "-c", group_code[g]]

    run = Launch(command, d.replica_groups, d, tmp_path, on_step=None)
    run.run(poll_s=0.05)
    return run, starts


FINISHES = (
    "import json, time; time.sleep(1.5); "
    "print(json.dumps({'step': 1, 'group': 0, 'outer_step': 1, 'healed': False}), flush=True); "
    "print(json.dumps({'done': {'group': 0, 'outer_steps': 1, 'checkpoint': 'x'}, 'allreduce_bytes': 8}), flush=True)"
)


def test_a_group_that_keeps_failing_is_dropped_with_its_reason_and_the_others_go_on(tmp_path):
    crashes = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    run, starts = _supervise(tmp_path, {0: FINISHES, 1: crashes}, max_restarts=2)
    assert starts.count((1, True)) == 2 and starts.count((1, False)) == 1  # started, then restarted twice
    assert [g.status for g in run.groups] == ["done", "dropped"]
    dropped = [e for e in run.events if e["event"] == "dropped"]
    assert dropped == [
        {
            "event": "dropped",
            "group": 1,
            "outer_step": 0,
            "reason": "exited with code 3 after 2 restarts (max_restarts)",
        }
    ]
    assert [e["last_error"] for e in run.events if e["event"] == "lost"] == ["boom"] * 3
    assert json.loads((tmp_path / "replicas.json").read_text()) == {"groups": []}


def test_a_restarted_group_that_does_not_rejoin_in_time_is_dropped(tmp_path):
    # group 1 dies once, and its restart never reports a healed step: dropped at rejoin_timeout_s
    flaky = "import os, sys, time\nif not os.path.exists({m!r}):\n    open({m!r}, 'w').close()\n    sys.exit(9)\ntime.sleep(60)"
    code = flaky.format(m=str(tmp_path / "started-once"))
    run, _ = _supervise(
        tmp_path,
        {0: FINISHES.replace("time.sleep(1.5)", "time.sleep(4)"), 1: code},
        rejoin_timeout_s=1.0,
        max_restarts=3,
    )
    reasons = [e["reason"] for e in run.events if e["event"] == "dropped"]
    assert reasons == ["did not rejoin within rejoin_timeout_s = 1"], run.events
    assert [g.status for g in run.groups] == ["done", "dropped"]


def test_trained_policy_runs_the_replica_groups_when_the_recipe_says_so(tmp_path, tiny_model_dir, repo_root):
    """The ``trained_policy`` asset (Pipes subprocess, the default launcher) with a two-group recipe:
    its metadata shows the groups and the outer steps."""
    from assets.train import trained_policy
    from resources.recipes import PipelineRecipes
    from resources.storage import StoreResource
    from resources.trainer import TrainerLauncher

    data = write_store(tmp_path / "data", 16)
    recipe = _recipe(tmp_path, tiny_model_dir, repo_root)

    @dg.asset(name="training_set")
    def training_set():
        return pa.table({"session_key": ["s1"], "kind": ["pair"]})

    res = dg.materialize(
        [training_set, trained_policy],
        resources={
            "recipes": PipelineRecipes(
                trace_root=str(tmp_path), train=str(recipe), train_steps=4, checkpoints_dir=str(tmp_path / "ck")
            ),
            "store": StoreResource(root=data),
            "trainer": TrainerLauncher(),
            "pipes_subprocess_client": dg.PipesSubprocessClient(),
        },
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert res.success
    md = res.asset_materializations_for_node("trained_policy")[-1].metadata
    assert md["replica_groups"].value == 2 and md["outer_steps"].value == 2
    assert md["groups_lost"].value == 0 and md["groups_rejoined"].value == 0 and md["groups_dropped"].value == []
    assert Path(md["checkpoint"].value, "model.safetensors").is_file()
