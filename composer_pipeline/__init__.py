"""composer-pipeline: Claude Code sessions -> trace states -> teacher replay -> DPO pairs -> trained policy.

Domain code only: nothing in this package imports Dagster. The Dagster layer lives in the
top-level ``assets/`` and ``resources/`` packages and calls the functions defined here.
"""

__version__ = "0.1.0"
