"""Ingestion: raw Claude Code session JSONL -> ``trace_states`` / ``trace_messages`` / ``quarantine``.

``discover`` finds sessions and their subagent files, ``scrub`` removes secrets before anything is
parsed, ``parser`` turns lines into records (quarantining what cannot be parsed) and ``states``
builds streams and one state per assistant API response: together the Python engine, the readable
reference. ``native`` (C++ in ``csrc/``) is the compiled engine, its rule-for-rule twin, used where
built. ``files`` reads a session file and tells its format (Claude Code or Codex, ``codex`` reading the
latter). ``pipeline`` ties them together per session (``SessionIngester`` / ``ingest_session`` /
``ingest_paths``), ``config`` holds the knobs of recipes/ingest.yaml.
"""
