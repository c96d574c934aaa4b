"""``ruff check`` and ``ruff format --check`` over the repo, with the rules of ``[tool.ruff]`` in pyproject.toml, as part of the test
command (``python3 -m composer_pipeline.bootstrap test``, which ``.ci/run`` runs): a lint error fails the
suite like any test. ruff is pinned in the ``test`` extra, so the bootstrap installs it into ``.venv``."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")  # the venv running the tests (.venv/bin/ruff)
    found = str(beside) if beside.is_file() else shutil.which("ruff")
    if found is None:
        pytest.fail(
            "ruff is not installed: `.venv/bin/pip install -e .[test]` (the bootstrap does) installs the pinned one"
        )
    return found


def test_ruff_check_passes():
    res = subprocess.run(
        [_ruff(), "check", "--no-cache", str(REPO)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, (
        f"ruff check found problems (rules: [tool.ruff] in pyproject.toml):\n{res.stdout}{res.stderr}"
    )


def test_ruff_format_leaves_every_file_as_it_is():
    res = subprocess.run(
        [_ruff(), "format", "--check", "--no-cache", str(REPO)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, (
        f"`ruff format` would change these files (run `.venv/bin/ruff format .`):\n{res.stdout}{res.stderr}"
    )
