"""Nightly training schedule: ``training_set`` -> ``trained_policy`` -> ``policy_eval``.

Cron from recipes/pipeline.yaml ``schedule_cron``, else recipes/train.yaml ``schedule.cron``, else
``0 3 * * *`` (03:00, after a day's sessions have been ingested and replayed by the sensor).
"""

from pathlib import Path

import dagster as dg
import yaml

DEFAULT_CRON = "0 3 * * *"

nightly_training_job = dg.define_asset_job(
    "nightly_training",
    selection=dg.AssetSelection.assets("training_set", "trained_policy", "policy_eval"),
    description="Gather every session's pairs, train the policy, evaluate it against the starting model.",
)


def training_cron(pipeline_cron, train_recipe) -> str:
    if pipeline_cron:
        return str(pipeline_cron)
    if train_recipe and Path(train_recipe).is_file():
        sched = (yaml.safe_load(Path(train_recipe).read_text()) or {}).get("schedule") or {}
        if sched.get("cron"):
            return str(sched["cron"])
    return DEFAULT_CRON


def build_nightly_schedule(cron: str) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="nightly_training",
        job=nightly_training_job,
        cron_schedule=cron,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Retrain on everything gathered so far, every night.",
    )
