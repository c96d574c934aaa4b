"""Partitions: one dynamic partition per Claude Code session (main file + its subagent files).

Keys are ``composer_pipeline.ingest.discover`` session keys; the sensor adds them.
"""

import warnings

import dagster as dg

# Checks of partitioned assets are declared per partition (AssetCheckSpec(partitions_def=...)), so each
# result names its session in the UI; Dagster 1.13 marks that argument "preview" and would print the
# warning in every run's log. Only that one warning is silenced.
warnings.filterwarnings("ignore", message=r".*partitions_def on an AssetCheckSpec.*", category=dg.PreviewWarning)
warnings.filterwarnings("ignore", message=r".*partitions_def.*asset_check.*", category=dg.PreviewWarning)

sessions_partitions = dg.DynamicPartitionsDefinition(name="sessions")


def session_check(name: str, *, asset: str, description: str, blocking: bool = False) -> dg.AssetCheckSpec:
    """A check of a session-partitioned asset, reported per session partition (the UI names its session)."""
    return dg.AssetCheckSpec(name, asset=asset, description=description, blocking=blocking,
                             partitions_def=sessions_partitions)
