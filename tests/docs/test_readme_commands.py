"""Every command the README prints, and every command `composer-pipeline demo` prints, runs as printed.

The commands are read out of README.md mechanically (each line of a ```bash block, continuation lines
joined, trailing ``# comments`` dropped; and every inline code span that starts with a command) and
run with ``bash -c`` from a directory laid out like the repo root: ``recipes/`` (the repo's, except that
``demo_teachers.yaml`` serves the offline tiny weights under its model names, and its teachers are
answered by the scripted loopback server, so the chain is fast, makes pairs, and cannot collide with a
running demo; ``8765`` in a command becomes a free port), a HOME whose ``~/.claude/projects`` holds
the bundled sample sessions, ``.venv`` (the venv running the tests; its ``bin/`` is NOT on PATH, so a
command a user could not run from the repo root without activating it fails here too), and ``.store``
holding what the CLI chain wrote (flat files, which every
reader takes like the demo's Dagster layout). Placeholders (``<pair_id>`` ...) are real ids from it.

A few commands are not run here because another test runs them (a real ``dagster dev``: tests/ui;
the bootstrap: CI's .ci/run; the demo: tests/dagster/test_dagster_demo.py). They are listed in
``COVERED_ELSEWHERE`` by pattern; a README command that matches nothing here and is not run fails
the test, so a new command cannot slip into the README untested.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

pytestmark = pytest.mark.slow  # runs the demo and every README command

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "composer_pipeline" / "samples" / "projects"

# pattern -> where the command is exercised instead
COVERED_ELSEWHERE = {
    r"composer_pipeline\.bootstrap test": ".ci/run runs exactly this command",
    r"composer_pipeline\.bootstrap demo": "tests/dagster/test_dagster_demo.py runs the demo's logic (the bootstrap: CI)",
    r"dagster dev": "tests/ui starts a real dagster dev and drives it in Chromium",
    r"pip install -e \.": "the bootstrap runs it (CI)",
    r"composer-pipeline experiment read-before-edit": "tests/experiments/test_read_before_edit.py runs its quick form",
    r"composer-pipeline sessions push": "tests/ingest/test_remote_roots.py runs it against the loopback S3 server",
    r"-m pytest": "it is this test suite (CI runs all of it; the fast subset is every test not marked slow)",
}
STARTS = ("composer-pipeline ", "python ", "python3 ", ".venv/bin/", "DAGSTER_HOME=")


def readme_commands(text: str) -> list[str]:
    """Commands in ```bash blocks (one per logical line) and inline code spans that start with one."""
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = re.sub(r"\s*\n\s*", " ", span).strip()
        if span.startswith(STARTS) and (len(span.split()) >= 3 or "--" in span):  # not "`composer-pipeline show`"
            out.append(span)
    return list(dict.fromkeys(out))


def _bare(cmd: str) -> str:
    """The command without the ``.venv/bin/`` the README prefixes (for matching commands by name)."""
    return cmd.removeprefix(".venv/bin/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scripted():
    from tests.support.scripted_server import ScriptedServer

    srv = ScriptedServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_model_dir, scripted):
    """A directory laid out like the repo root, plus HOME and the environment a user's shell has."""
    base = tmp_path_factory.mktemp("readme")
    r = base / "root"
    shutil.copytree(REPO / "recipes", r / "recipes")
    port = _free_port()
    demo = yaml.safe_load((r / "recipes" / "demo_teachers.yaml").read_text())
    demo["serve"] = {name: str(tiny_model_dir) for name in demo["serve"]}  # offline tiny weights, same names
    for t in demo["teachers"]:
        t["base_url"] = scripted.url
    (r / "recipes" / "demo_teachers.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))
    train = yaml.safe_load((r / "recipes" / "train.yaml").read_text())
    train["optim"]["steps"] = 2
    (r / "recipes" / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
    home = base / "home"
    shutil.copytree(SAMPLES, home / ".claude" / "projects")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSER_")}
    # .../.venv/bin (unresolved: the venv, not the base interpreter)
    venv_bin = Path(sys.executable).parent
    (r / ".venv").symlink_to(venv_bin.parent, target_is_directory=True)
    path = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != venv_bin)
    env.update(
        HOME=str(home),
        PATH=path,
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        OMP_NUM_THREADS="1",
        COMPOSER_PIPELINE_HOME=str(base / "cp_home"),
    )
    return {"dir": r, "env": env, "port": port, "background": []}


def run(root, cmd: str, timeout: float = 600) -> str:
    # the one substitution: see the module docstring
    cmd = cmd.replace("8765", str(root["port"]))
    # a server the README starts in the background
    if cmd.endswith("&"):
        proc = subprocess.Popen(
            ["bash", "-c", cmd[:-1]],
            cwd=root["dir"],
            env=root["env"],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        root["background"].append(proc)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{cmd!r} exited with {proc.returncode}"
            try:
                if httpx.get(f"http://127.0.0.1:{root['port']}/v1/models", timeout=2).status_code == 200:
                    return ""
            except httpx.HTTPError:
                time.sleep(0.5)
        raise AssertionError(f"{cmd!r} did not start serving")
    res = subprocess.run(
        ["bash", "-c", cmd], cwd=root["dir"], env=root["env"], capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, f"{cmd!r} exited {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def readme_run(root):
    """Runs every README command (in README order, the CLI chain first); what ran, what is covered elsewhere."""
    commands = readme_commands((REPO / "README.md").read_text())
    elsewhere = {c for c in commands for pat in COVERED_ELSEWHERE if re.search(pat, c)}
    ran: list[str] = []
    ids: dict[str, str] = {}
    try:
        # the CLI section first (it makes data/), in README order; then .store gets the same tables
        cli = [
            c
            for c in commands
            if c not in elsewhere
            and "--store .store" not in c
            and "<pair_id>" not in c
            and "<state_id|pair_id>" not in c
            and not _bare(c).startswith(("composer-pipeline train eval", 'composer-pipeline sql "select drop_op'))
        ]
        for c in cli:
            out = run(root, c)
            ran.append(c)
            if _bare(c).startswith("composer-pipeline pairs"):
                summary = orjson.loads(out.strip().splitlines()[-1])
                # the demo recipe's samples agree: pairs exist
                assert summary["pairs_by_agreement_kind"], summary
                shutil.copytree(root["dir"] / "data", root["dir"] / ".store")
                pairs = orjson.loads(
                    run(
                        root,
                        '.venv/bin/composer-pipeline sql "select pair_id, state_id from '
                        'normalized_dpo_pairs limit 1" --store data/ --json',
                    )
                )
                ids = {"<pair_id>": pairs[0]["pair_id"], "<state_id|pair_id>": pairs[0]["state_id"]}
        assert ids, "no pair to substitute: the CLI chain made none"
        ids["<start model>"] = "tiny"
        rest = [c for c in commands if c not in elsewhere and c not in ran]
        for c in rest:
            printed = c
            for k, v in ids.items():
                c = c.replace(k, v)
            out = run(root, c)
            ran.append(printed)
            if "lineage" in c or _bare(c).startswith("composer-pipeline show"):
                assert ids["<pair_id>"] in out or ids["<state_id|pair_id>"] in out, (c, out[:500])
    finally:
        for p in root["background"]:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=30)
    return {"commands": commands, "ran": ran, "elsewhere": elsewhere, "ids": ids}


def test_every_readme_command_runs_as_printed(readme_run):
    commands, ran, elsewhere = readme_run["commands"], readme_run["ran"], readme_run["elsewhere"]
    # each README command ran here or is covered
    assert sorted(set(ran) | elsewhere) == sorted(commands)
    assert len(ran) >= 15, ran
    assert any(_bare(c).startswith("composer-pipeline show <pair_id>") for c in ran)  # the one that failed before
    # from the repo root a bare `composer-pipeline` / `python` is not the venv's: every command names it
    bare = [c for c in commands if c.startswith(("composer-pipeline ", "python "))]
    assert bare == [], f"README commands that fail without an activated venv: {bare}"


def test_every_command_the_demo_prints_runs_as_printed(root, readme_run, monkeypatch):
    """The report's "next:" commands, printed for a store like the demo's (the real demo: test_dagster_demo)."""
    from assets.demo import DemoReport, print_report

    # the demo prints commands for the directory it runs in
    monkeypatch.chdir(root["dir"])
    # ... and for the shell it runs in (no venv activated)
    monkeypatch.setenv("PATH", root["env"]["PATH"])

    store = root["dir"] / ".store"
    pid = orjson.loads(
        run(root, '.venv/bin/composer-pipeline sql "select pair_id from normalized_dpo_pairs limit 1" --json')
    )
    report = DemoReport(
        store=str(store),
        sessions=["s"],
        example_pair=pid[0]["pair_id"],
        ui_env="DAGSTER_HOME=x",
        row_counts={"trace_states": 1, "training_set": 1},
    )
    lines: list[str] = []
    print_report(report, echo=lines.append)
    nxt = lines[lines.index("next:") + 1 :]
    commands = [ln.strip() for ln in nxt if not ln.strip().startswith("the UI")]
    assert len(commands) == 5
    for c in commands:
        if any(re.search(pat, c) for pat in COVERED_ELSEWHERE):
            continue
        out = run(root, c)
        if " lineage " in c or " show " in c:
            assert pid[0]["pair_id"] in out
