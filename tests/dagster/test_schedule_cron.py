"""The nightly schedule's cron has one home: recipes/train.yaml (`schedule.cron`), default 03:00 UTC."""

import pytest
import yaml

from assets.schedules import build_nightly_schedule, training_cron
from assets.settings import load_settings
from composer_pipeline.train.config import TrainRecipe


def test_cron_from_the_train_recipe(tmp_path, repo_root):
    assert training_cron(str(repo_root / "recipes" / "train.yaml")) == "0 3 * * *"
    assert training_cron(None) == TrainRecipe().schedule.cron == "0 3 * * *"  # no train recipe: its default
    raw = yaml.safe_load((repo_root / "recipes" / "train.yaml").read_text())
    raw["schedule"]["cron"] = "30 4 * * 1-5"
    p = tmp_path / "train.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert TrainRecipe.load(p).schedule.cron == "30 4 * * 1-5"
    sched = build_nightly_schedule(training_cron(str(p)))
    assert sched.cron_schedule == "30 4 * * 1-5" and sched.name == "nightly_training"


def test_unknown_schedule_key_is_an_error():
    with pytest.raises(ValueError, match="unknown keys"):
        TrainRecipe.from_dict({"schedule": {"crom": "0 3 * * *"}})


def test_the_old_pipeline_cron_key_names_its_one_home(tmp_path):
    p = tmp_path / "pipeline.yaml"
    p.write_text("schedule_cron: '0 1 * * *'\n")
    with pytest.raises(
        ValueError,
        match=r"unknown keys \['schedule_cron'\].*'schedule_cron' now lives in recipes/train.yaml \(schedule.cron\)",
    ):
        load_settings(p)
