"""Where the pipeline keeps state between runs on this machine (ledger, response cache, converted models)."""

from __future__ import annotations

import os
from pathlib import Path


def default_home() -> Path:
    """``$COMPOSER_PIPELINE_HOME`` or ``~/.cache/composer-pipeline``: ledger, cache, converted models."""
    return Path(os.environ.get("COMPOSER_PIPELINE_HOME") or Path.home() / ".cache" / "composer-pipeline").expanduser()
