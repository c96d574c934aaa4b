"""Partitions: one dynamic partition per Claude Code session (main file + its subagent files).

Keys are ``composer_pipeline.ingest.discover`` session keys; the sensor adds them.
"""

import dagster as dg

sessions_partitions = dg.DynamicPartitionsDefinition(name="sessions")
