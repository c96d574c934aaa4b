"""The Dagster layer: thin assets over ``composer_pipeline`` stage functions (see definitions.py)."""
