"""The Dagster ``Definitions`` of composer-pipeline (``dagster dev -w workspace.yaml`` loads ``defs``).

``build_defs(settings)`` wires assets, checks, the sessions and batch-collect sensors, the nightly schedule and the
resources from ``recipes/pipeline.yaml`` (tests pass their own settings). In-process executor by
default: a subprocess per step costs 5-8 s here and buys nothing on 2 cores.
"""

import dagster as dg

from assets import ingest, pairs, replay, train
from assets.executors import build_executor
from assets.schedules import build_nightly_schedule, nightly_training_job, training_cron
from assets.sensors import build_batch_collect_sensor, build_sessions_sensor
from assets.settings import PipelineSettings, load_settings
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.storage import ParquetIOManager, StoreResource
from resources.teachers import TeachersResource, api_key_envvars
from resources.trainer import TrainerLauncher

PER_SESSION = (
    dg.AssetSelection.tag("stage", "ingest")
    | dg.AssetSelection.tag("stage", "replay")
    | dg.AssetSelection.assets(
        "dpo_pairs", "agreement_positives", "pairs_dropped_at_build", "normalized_dpo_pairs", "dropped_pairs"
    )
)

session_chain_job = dg.define_asset_job(
    "session_chain",
    selection=PER_SESSION,
    description="One session: ingest -> cost plan (blocking budget check) -> teacher replay -> pairs -> normalized pairs.",
)

# what batch_collect_sensor runs for a partition whose provider batches ended: the replay table and its pairs
# (trace_states, trace_messages and cost_plan are read as the submitting run stored them)
batch_collect_job = dg.define_asset_job(
    "batch_collect",
    selection=dg.AssetSelection.assets(
        "teacher_replays",
        "dpo_pairs",
        "agreement_positives",
        "pairs_dropped_at_build",
        "normalized_dpo_pairs",
        "dropped_pairs",
    ),
    description="Batch mode: collect a session's ended provider batches into teacher_replays, then its pairs.",
)


def build_resources(s: PipelineSettings) -> dict:
    teachers_recipe = s.recipes.get("teachers") or ""
    return {
        "io_manager": ParquetIOManager(root=s.store_root),
        "store": StoreResource(root=s.store_root),
        "recipes": PipelineRecipes.from_settings(s),
        "teachers": TeachersResource(
            recipe=teachers_recipe, api_keys=api_key_envvars(teachers_recipe), cache_dir=s.cache_dir
        ),
        "ledger": LedgerResource(path=s.ledger_path),
        "trainer": TrainerLauncher.from_deployment(s.deployment.trainer),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
    }


def build_defs(settings: PipelineSettings | None = None) -> dg.Definitions:
    s = settings or load_settings()
    return dg.Definitions(
        assets=[
            ingest.raw_sessions,
            ingest.ingest_session_tables,
            replay.cost_plan,
            replay.teacher_replays,
            pairs.consensus_pairs,
            pairs.normalized_pairs,
            pairs.training_set,
            train.trained_policy,
            train.policy_eval,
        ],
        asset_checks=[replay.cost_plan_within_budget],
        jobs=[session_chain_job, batch_collect_job, nightly_training_job],
        sensors=[
            build_sessions_sensor(session_chain_job, s.sensor_interval_s, s.trace_roots),
            build_batch_collect_sensor(batch_collect_job),
        ],
        schedules=[build_nightly_schedule(training_cron(s.recipe("train")))],
        resources=build_resources(s),
        # deployment.executor (default in_process; docs/SCALING.md)
        executor=build_executor(s),
    )


defs = build_defs()
