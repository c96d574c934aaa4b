"""``sessions_sensor``: scans the trace root, adds one dynamic partition per session and requests
runs for new or changed sessions.

In: ``discover_sessions(trace_root)`` and ``session_fingerprint``. Out: ``SensorResult`` with
add-partition requests and one ``RunRequest`` per new/changed session (run_key
``<session_key>:<fingerprint>``, so a changed file runs again and an unchanged one never does).
The cursor maps session key -> last requested fingerprint.
"""

import json
from pathlib import Path

import dagster as dg

from assets.partitions import sessions_partitions
from resources.recipes import PipelineRecipes


def scan_sessions(trace_root: str) -> dict[str, str]:
    """session key -> fingerprint of everything under ``trace_root``."""
    from composer_pipeline.ingest.discover import discover_sessions, session_fingerprint

    return {sf.key: session_fingerprint(sf) for sf in discover_sessions(trace_root)}


def build_sessions_sensor(target, minimum_interval_seconds: int = 60) -> dg.SensorDefinition:
    @dg.sensor(
        name="sessions_sensor",
        target=target,
        minimum_interval_seconds=minimum_interval_seconds,
        description="Adds a `sessions` partition per new Claude Code session under the trace root and "
        "requests a run for each new or changed session.",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def sessions_sensor(context: dg.SensorEvaluationContext, recipes: PipelineRecipes):
        if not Path(recipes.trace_root).is_dir():
            return dg.SkipReason(f"trace root {recipes.trace_root} does not exist: set trace_root in "
                                 "recipes/pipeline.yaml or COMPOSER_TRACE_ROOT")
        seen = json.loads(context.cursor) if context.cursor else {}
        current = scan_sessions(recipes.trace_root)
        existing = set(context.instance.get_dynamic_partitions(sessions_partitions.name))
        new_keys = sorted(k for k in current if k not in existing)
        changed = sorted(k for k, fp in current.items() if seen.get(k) != fp)
        if not new_keys and not changed:
            return dg.SkipReason(f"{len(current)} sessions under {recipes.trace_root}, none new or changed")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(partition_key=k, run_key=f"{k}:{current[k]}") for k in changed],
            dynamic_partitions_requests=[sessions_partitions.build_add_request(new_keys)] if new_keys else [],
            cursor=json.dumps({**seen, **current}, sort_keys=True),
        )

    return sessions_sensor
