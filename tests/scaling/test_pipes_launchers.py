"""A real training run through Dagster Pipes behind the torchrun and accelerate prefixes.

The tiny offline model trains 2 steps on the synthetic store, started by ``TrainerLauncher.run`` with
``launcher: torchrun`` / ``accelerate`` (one rank): the same call ``trained_policy`` makes. The Pipes
messages (step lines, final materialization with the checkpoint) must come back through the
launcher, and the checkpoint must exist.
"""

import json
from pathlib import Path

import dagster as dg
import pytest

from resources.trainer import TrainerLauncher
from tests.support.synthetic_train import write_store


@pytest.fixture(scope="module")
def synth_store(tmp_path_factory) -> str:
    return write_store(tmp_path_factory.mktemp("scaling-train-data"))


# a training run behind each launcher (tests/train covers the trainer itself)
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_pipes_training_through_launcher(launcher, tiny_model_dir, synth_store, tmp_path, repo_root):
    out_dir = tmp_path / "ckpt"
    trainer = TrainerLauncher(launcher=launcher, nproc_per_node=1)

    @dg.asset
    def policy(context: dg.AssetExecutionContext):
        extras = {
            "data_root": synth_store,
            "recipe": str(repo_root / "recipes" / "train.yaml"),
            "model": str(tiny_model_dir),
            "steps": 2,
            "out_dir": str(out_dir),
        }
        yield from trainer.run(context, extras=extras, pipes_client=dg.PipesSubprocessClient()).get_results()

    instance = dg.DagsterInstance.ephemeral()
    res = dg.materialize([policy], instance=instance)
    assert res.success
    mats = res.get_asset_materialization_events()
    assert len(mats) == 1
    md = mats[0].materialization.metadata
    assert md["steps"].value == 2
    ckpt = Path(md["checkpoint"].value)
    assert ckpt.is_dir() and (ckpt / "metrics.json").is_file() and str(ckpt).startswith(str(out_dir))
    assert json.loads((ckpt / "metrics.json").read_text())["steps"] == 2
    steps = []
    for entry in instance.all_logs(res.run_id):
        msg = entry.user_message or ""
        if msg.startswith("{") and '"step"' in msg:
            steps.append(json.loads(msg)["step"])
    assert steps == [1, 2], "the per-step lines did not come back through Pipes"
