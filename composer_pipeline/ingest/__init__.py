"""Ingestion: raw Claude Code session JSONL -> ``trace_states`` / ``trace_messages`` / ``quarantine``.

``discover`` finds sessions and their subagent files, ``parser`` turns lines into records
(quarantining what cannot be parsed), ``scrub`` removes secrets before anything is parsed,
``states`` builds streams and one state per assistant API response, ``pipeline`` ties them together
per session (``ingest_session`` / ``ingest_paths``), ``recipe`` holds the knobs of recipes/ingest.yaml.
"""
