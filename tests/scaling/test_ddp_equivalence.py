"""Data-parallel training is one model on N shards: 2 CPU ranks (gloo) == 1 process, same global batch.

The 2-rank run goes through ``TrainerLauncher(launcher="torchrun", nproc_per_node=2).run``, the call
``trained_policy`` makes, under Dagster Pipes; the 1-process run is the plain CLI entry. All three
channels are on (GRPO rollouts, hint-SDPO at error sites that sit on one rank only in each step, DPO
pairs split over the ranks). Per-step losses and rewards must agree, and so must the final weights,
to float rounding, while the weights themselves moved by orders of magnitude more.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from resources.trainer import TrainerLauncher
from tests.support.synthetic_train import write_store

pytestmark = pytest.mark.slow  # two torch.distributed ranks per test

STEPS = 3


@pytest.fixture(scope="module")
def ddp_setup(tmp_path_factory, tiny_model_dir, repo_root):
    root = tmp_path_factory.mktemp("ddp")
    data = write_store(root / "data", 16)
    recipe = yaml.safe_load((repo_root / "recipes" / "train.yaml").read_text())
    recipe["model"] = str(tiny_model_dir)
    recipe["optim"].update(steps=STEPS, learning_rate=1e-3)
    recipe["grpo"]["max_completion_length"] = 16
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return root, data, path


def _one_process(root: Path, data: str, recipe: Path) -> Path:
    out = root / "one"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline.train.pipes_entry",
            "--data-root",
            data,
            "--recipe",
            str(recipe),
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "checkpoint"


def _two_ranks_through_pipes(root: Path, data: str, recipe: Path):
    out = root / "two"
    trainer = TrainerLauncher(launcher="torchrun", nproc_per_node=2)
    assert "--standalone" in trainer.command() and "--nproc-per-node=2" in trainer.command()

    @dg.asset
    def policy(context: dg.AssetExecutionContext):
        extras = {"data_root": data, "recipe": str(recipe), "model": None, "steps": STEPS, "out_dir": str(out)}
        yield from trainer.run(context, extras=extras, pipes_client=dg.PipesSubprocessClient()).get_results()

    instance = dg.DagsterInstance.ephemeral()
    res = dg.materialize([policy], instance=instance)
    assert res.success
    return res, instance


def _weights(ckpt: Path):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


def test_two_ranks_train_the_same_model_as_one_process(ddp_setup, tiny_model_dir):
    root, data, recipe = ddp_setup
    one = _one_process(root, data, recipe)
    res, instance = _two_ranks_through_pipes(root, data, recipe)

    # Pipes: rank 0 alone reports: one line per step, one materialization, the checkpoint it wrote
    mats = res.get_asset_materialization_events()
    assert len(mats) == 1
    md = mats[0].materialization.metadata
    two = Path(md["checkpoint"].value)
    assert md["steps"].value == STEPS and md["channels_off"].value == "{}"
    piped = [
        json.loads(e.user_message)
        for e in instance.all_logs(res.run_id)
        if (e.user_message or "").startswith('{"step"')
    ]
    assert [r["step"] for r in piped] == list(range(1, STEPS + 1)), "each step must come back once, from rank 0"
    assert json.loads((two / "metrics.json").read_text())["world_size"] == 2
    assert json.loads((one / "metrics.json").read_text())["world_size"] == 1

    a = [json.loads(line) for line in (one / "losses.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (two / "losses.jsonl").read_text().splitlines()]
    assert b == piped  # what Pipes carried is what was saved
    assert len(a) == len(b) == STEPS
    for ra, rb in zip(a, b):
        for ch in ("grpo", "sdpo", "dpo"):
            assert ra[ch] is not None and rb[ch] is not None, (
                f"channel {ch} did not fire: {ra['off_reasons']} / {rb['off_reasons']}"
            )
        assert (
            abs(ra["dpo"] - rb["dpo"]) < 1e-5
            and abs(ra["sdpo"] - rb["sdpo"]) < 1e-6
            and abs(ra["grpo"] - rb["grpo"]) < 1e-6
        )
        assert abs(ra["total"] - rb["total"]) < 1e-5
        assert abs(ra["reward"] - rb["reward"]) < 1e-5 and abs(ra["reward_std"] - rb["reward_std"]) < 1e-5
        assert ra["error_sites"] == rb["error_sites"] > 0 and ra["dpo_batches"] == rb["dpo_batches"]
        assert ra["states"] == rb["states"] and len(rb["states"]) == 2  # the global batch: both ranks' prompts
        # the shipped default's NLL on the chosen answers: a token mean over the global batch on both
        assert abs(ra["dpo_sft"] - rb["dpo_sft"]) < 1e-5 and abs(ra["dpo_dpop"] - rb["dpo_dpop"]) < 1e-5
    # frozen reference really computed on both: the preference part starts at ln 2
    assert a[0]["dpo"] - a[0]["dpo_sft"] == pytest.approx(0.6931471824645996, abs=1e-5)
    assert a[-1]["dpo"] < a[0]["dpo"]  # and the DPO loss moved

    wa, wb, w0 = _weights(one), _weights(two), _weights(tiny_model_dir)
    assert wa.keys() == wb.keys()
    moved = max(float((wa[k] - w0[k]).abs().max()) for k in wa)
    apart = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert moved > 1e-3, moved
    assert apart < 5e-5 and apart < moved / 50, (apart, moved)


def test_two_ranks_hint_distillation_alone(ddp_setup):
    """GRPO and DPO off: each step's error sites sit on one rank; the other runs the same forwards at
    weight 0 (a rank that skipped them would leave DDP's collectives unmatched and hang)."""
    root, data, recipe = ddp_setup
    raw = yaml.safe_load(recipe.read_text())
    raw["weights"] = {"grpo": 0.0, "sdpo": 1.0, "dpo": 0.0}
    sdpo = root / "sdpo.yaml"
    sdpo.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    runs = {}
    for n in (1, 2):
        out = root / f"sdpo{n}"
        cmd = (
            TrainerLauncher(launcher="torchrun", nproc_per_node=n).command()
            if n > 1
            else [sys.executable, "-m", "composer_pipeline.train.pipes_entry"]
        )
        proc = subprocess.run(
            [*cmd, "--data-root", data, "--recipe", str(sdpo), "--out-dir", str(out), "--steps", "2"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        assert [r["step"] for r in lines if "step" in r] == [1, 2] and sum(
            "materialization" in r for r in lines
        ) == 1  # rank 0 prints
        runs[n] = (lines[:2], _weights(out / "checkpoint"))
    (a, wa), (b, wb) = runs[1], runs[2]
    for ra, rb in zip(a, b):
        assert ra["grpo"] is None and rb["dpo"] is None and ra["sdpo"] is not None
        assert abs(ra["sdpo"] - rb["sdpo"]) < 1e-6 and ra["error_sites"] == rb["error_sites"] > 0
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 5e-5
