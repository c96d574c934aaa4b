"""Dagster resources: one module per external thing (storage, teachers, ledger, trainer launcher).

Each wraps a domain object from ``composer_pipeline`` so assets stay thin; secrets enter only
through ``dg.EnvVar`` fields and never reach metadata or logs.
"""
