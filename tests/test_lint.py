"""``ruff check`` and ``ruff format --check`` over the repo, with the rules of ``[tool.ruff]`` in pyproject.toml, as part of the test
command (``python3 -m composer_pipeline.bootstrap test``, which ``.ci/run`` runs): a lint error fails the
suite like any test. ruff is pinned in the ``test`` extra, so the bootstrap installs it into ``.venv``."""

import io
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# a comment after code longer than this goes on its own line above it (issue 36)
TRAILING_COMMENT_MAX = 40
DIRECTIVES = ("# type:", "# noqa", "# pragma", "# fmt:", "# pyright:", "# ruff:")


def _ruff() -> str:
    # the venv running the tests (.venv/bin/ruff)
    beside = Path(sys.executable).with_name("ruff")
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


def test_comments_longer_than_a_few_words_sit_on_their_own_line():
    """Issue 36: short comments trail code; a longer one goes on its own line above it (as TRL and
    dagster-open-platform write them). Directives (``# type:``, ``# noqa``, ``# fmt:``) may trail at any length."""
    found = []
    paths = [
        p for top in ("composer_pipeline", "assets", "resources", "tests", "bench") for p in (REPO / top).rglob("*.py")
    ]
    for path in sorted(paths):
        rel = path.relative_to(REPO)
        src = path.read_text()
        lines = src.splitlines()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type != tokenize.COMMENT or not lines[tok.start[0] - 1][: tok.start[1]].strip():
                continue
            text = tok.string
            if len(text) > TRAILING_COMMENT_MAX and not text.lower().startswith(DIRECTIVES) and "noqa" not in text:
                found.append(f"{rel}:{tok.start[0]}: {text[:60]}")
    assert not found, f"{len(found)} trailing comments over {TRAILING_COMMENT_MAX} characters:\n" + "\n".join(
        found[:40]
    )
