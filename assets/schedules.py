"""Nightly training schedule: ``training_set`` -> ``trained_policy`` -> ``policy_eval``.

Cron: ``schedule.cron`` of the train recipe, its one home (default ``0 3 * * *``: 03:00, after a
day's sessions have been ingested and replayed by the sensor).
"""

import dagster as dg

from composer_pipeline.train.config import TrainRecipe

nightly_training_job = dg.define_asset_job(
    "nightly_training",
    selection=dg.AssetSelection.assets("training_set", "trained_policy", "policy_eval"),
    description="Gather every session's pairs, train the policy, evaluate it against the starting model.",
)


def training_cron(train_recipe: str | None) -> str:
    """``schedule.cron`` of the train recipe at ``train_recipe`` (None: the recipe's default)."""
    return (TrainRecipe.load(train_recipe) if train_recipe else TrainRecipe()).schedule.cron


def build_nightly_schedule(cron: str) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="nightly_training",
        job=nightly_training_job,
        cron_schedule=cron,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Retrain on everything gathered so far, every night.",
    )
