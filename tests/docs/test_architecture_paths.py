"""Every file path docs/ARCHITECTURE.md names exists (issue 36: the docs kept naming
``composer_pipeline/testing/`` after the helpers moved). A path with a folder is read from the repo root or
from ``composer_pipeline/`` or one of its packages (``csrc/...`` in the ingest row); a bare file name must be some tracked file's name; the few names that are
outputs, not files of the repo, are listed with what writes them."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATH = re.compile(r"`([A-Za-z0-9_./-]+(?:\.(?:py|md|yaml|toml|json|sh|cpp|h)|/))`")
OUTPUTS = {"metrics.json": "written into each checkpoint (train/checkpoints.py)"}


def test_every_path_the_architecture_names_exists():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    names = {Path(f).name for f in tracked}
    bases = [REPO, REPO / "composer_pipeline", *(p for p in (REPO / "composer_pipeline").iterdir() if p.is_dir())]
    missing = []
    for path in sorted(set(PATH.findall(text))):
        if "/" in path.rstrip("/"):
            if not any((base / path).exists() for base in bases):
                missing.append(path)
        elif path.endswith("/"):
            if not any((base / path).is_dir() for base in bases):
                missing.append(path)
        elif path not in names and path not in OUTPUTS:
            missing.append(path)
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"
