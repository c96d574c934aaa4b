"""The nightly schedule's cron comes from recipes/train.yaml (`schedule.cron`), default 03:00 UTC."""

import pytest
import yaml

from assets.schedules import build_nightly_schedule, training_cron
from composer_pipeline.train.config import TrainRecipe


def test_cron_from_the_train_recipe(tmp_path, repo_root):
    assert training_cron(None, str(repo_root / "recipes" / "train.yaml")) == "0 3 * * *"
    raw = yaml.safe_load((repo_root / "recipes" / "train.yaml").read_text())
    raw["schedule"]["cron"] = "30 4 * * 1-5"
    p = tmp_path / "train.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert TrainRecipe.load(p).schedule.cron == "30 4 * * 1-5"
    sched = build_nightly_schedule(training_cron(None, str(p)))
    assert sched.cron_schedule == "30 4 * * 1-5" and sched.name == "nightly_training"
    assert training_cron("0 1 * * *", str(p)) == "0 1 * * *"  # pipeline.yaml's schedule_cron wins


def test_unknown_schedule_key_is_an_error():
    with pytest.raises(ValueError, match="unknown keys"):
        TrainRecipe.from_dict({"schedule": {"crom": "0 3 * * *"}})
