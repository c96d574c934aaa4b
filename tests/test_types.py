"""``mypy`` over the package and the Dagster layer, with the configuration of ``[tool.mypy]`` in pyproject.toml
(which files, untyped function bodies checked, the packages that ship no types), as part of the test command
(``python3 -m composer_pipeline.bootstrap test``, which ``.ci/run`` runs): a type error fails the suite like any
test. mypy and the stubs it needs are pinned in the ``test`` extra, so the bootstrap installs them into ``.venv``."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _mypy() -> str:
    # the venv running the tests (.venv/bin/mypy)
    beside = Path(sys.executable).with_name("mypy")
    found = str(beside) if beside.is_file() else shutil.which("mypy")
    if found is None:
        pytest.fail(
            "mypy is not installed: `.venv/bin/pip install -e .[test]` (the bootstrap does) installs the pinned one"
        )
    return found


# a whole-program check from an empty cache: ~40 s here
@pytest.mark.slow
def test_mypy_passes(tmp_path):
    # the cache in the test's own folder: a fresh clone has none, and the checkout is not written to
    res = subprocess.run(
        [_mypy(), "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(tmp_path / "mypy_cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, (
        f"mypy found type errors (configuration: [tool.mypy] in pyproject.toml):\n{res.stdout}{res.stderr}"
    )
