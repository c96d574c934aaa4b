"""Fixtures shared by every test module: environment, the real traces, the tiny model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = Path(os.environ.get("COMPOSER_SHARED_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real Claude Code sessions beside the checkout (CI has them too)."""
    assert SHARED_TRACES.is_dir(), f"real traces not found at {SHARED_TRACES}"
    return SHARED_TRACES


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """One offline tiny causal LM + tokenizer for the whole test session."""
    from composer_pipeline.train.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(out)
    return out
