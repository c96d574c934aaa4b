"""Where the pipeline keeps state between runs on this machine: the one default of each location.

In: ``$COMPOSER_PIPELINE_HOME`` (default ``~/.cache/composer-pipeline``) and ``$COMPOSER_LEDGER_URL``.
Out: the home directory, the default budget ledger URL and the default teacher response cache. The
CLI (``replay``, ``teachers budget|reconcile|stop``), the Dagster layer (``recipes/pipeline.yaml``'s
``ledger_path``/``cache_dir`` left null) and the docs all read these functions, so a CLI replay and a
Dagster run of the same states spend against one ledger and never buy an answer twice.

Deliberately simplified: one home per user (not per checkout): budgets are money, and money spent from
one checkout or directory must count in every other.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_home() -> Path:
    """``$COMPOSER_PIPELINE_HOME`` or ``~/.cache/composer-pipeline``: ledger, cache, converted models."""
    return Path(os.environ.get("COMPOSER_PIPELINE_HOME") or Path.home() / ".cache" / "composer-pipeline").expanduser()


def default_ledger_url(configured: str | None = None) -> str:
    """``$COMPOSER_LEDGER_URL``, else ``configured`` (a recipe's ``ledger_path``), else ``<home>/ledger.sqlite``."""
    return os.environ.get("COMPOSER_LEDGER_URL") or configured or str(default_home() / "ledger.sqlite")


def default_cache_dir(configured: str | None = None) -> str:
    """``configured`` (a recipe's ``cache_dir``), else ``<home>/teacher_cache``: the teacher response cache.
    Local teacher servers a run starts keep their pid and log files beside it (its parent directory)."""
    return configured or str(default_home() / "teacher_cache")
