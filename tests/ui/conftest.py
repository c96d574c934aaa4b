"""A real ``dagster dev`` per test (free loopback port, temporary DAGSTER_HOME, stopped by pid)
and one headless Debian Chromium driven by Playwright for the session.

Each UI test gets its own trace root (copies of the bundled sample sessions), store, ledger and
response cache, a scripted OpenAI-compatible teacher server on 127.0.0.1 (real HTTP; it answers a
``Read`` tool call, so two teachers agree and pairs exist), and the offline tiny model for training.
Screenshots land in ``artifacts/ui/`` (git-ignored) for a person to look at.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "composer_pipeline" / "samples" / "projects"
ARTIFACTS = REPO / "artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
LOCATION = "assets.definitions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class DagsterUI:
    url: str
    home: Path
    trace_root: Path
    store: Path
    teachers: object  # ScriptedServer
    proc: subprocess.Popen
    log: Path
    env: dict = field(default_factory=dict)

    # -- GraphQL, for waiting on what the UI started (never to do the user's clicks)
    def gql(self, query: str, variables: dict | None = None) -> dict:
        req = urllib.request.Request(
            self.url + "/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert "errors" not in out, out
        return out["data"]

    def runs(self) -> list[dict]:
        q = "{ runsOrError { ... on Runs { results { runId status jobName tags { key value } } } } }"
        return self.gql(q)["runsOrError"]["results"]

    def wait_runs_done(self, n_at_least: int, timeout: float = 300) -> list[dict]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            runs = self.runs()
            if len(runs) >= n_at_least and all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs):
                return runs
            time.sleep(2)
        raise AssertionError(f"runs not finished in {timeout}s: {self.runs()}\n{self.log.read_text()[-4000:]}")

    def partition_keys(self) -> list[str]:
        q = """query($sel: RepositorySelector!) { repositoryOrError(repositorySelector: $sel) {
               ... on Repository { partitionSets { name } } } }"""
        del q  # dynamic partitions are read from the instance instead (no partition set for assets)
        from dagster import DagsterInstance

        with DagsterInstance.from_config(str(self.home)) as inst:
            return list(inst.get_dynamic_partitions("sessions"))


def write_pipeline_recipe(tmp: Path, *, trace_root: Path, store: Path, teachers_yaml: Path, tiny_model: Path,
                          sensor_interval_s: int = 5) -> Path:
    train = yaml.safe_load((REPO / "recipes" / "train.yaml").read_text())
    train["optim"]["steps"] = 2
    train_path = tmp / "train.yaml"
    train_path.write_text(yaml.safe_dump(train))
    recipe = {
        "trace_root": str(trace_root),
        "store_root": str(store),
        "ledger_path": str(tmp / "state" / "ledger.duckdb"),
        "cache_dir": str(tmp / "state" / "teacher_cache"),
        "checkpoints_dir": str(tmp / "state" / "checkpoints"),
        "recipes": {
            "ingest": str(REPO / "recipes" / "ingest.yaml"),
            "teachers": str(teachers_yaml),
            "pairs": str(REPO / "recipes" / "pairs.yaml"),
            "normalize": str(REPO / "recipes" / "normalize.yaml"),
            "train": str(train_path),
        },
        "train": {"model": str(tiny_model), "steps": 2},
        "sensor_interval_s": sensor_interval_s,
    }
    p = tmp / "pipeline.yaml"
    p.write_text(yaml.safe_dump(recipe))
    return p


def write_teachers(path: Path, url: str, *, ceiling_usd: float = 5.0) -> Path:
    path.write_text(yaml.safe_dump({
        "ceiling_usd": ceiling_usd,
        "teachers": [
            {"name": name, "base_url": url, "model": "scripted", "api_key_env": None,
             "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "budget_usd": 10.0,
             "max_concurrency": 2, "max_tokens": 64, "temperature": 0.0, "timeout_s": 30, "max_retries": 1}
            for name in ("teacher_a", "teacher_b")
        ],
    }))
    return path


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian chromium missing: the test command installs it (composer_pipeline.bootstrap)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    ctx.close()


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(p), full_page=False)
    return p


@pytest.fixture
def start_dagster(tmp_path, tiny_model_dir):
    """Factory: ``start_dagster(sessions=N, ceiling_usd=X)`` -> a running :class:`DagsterUI`."""
    from composer_pipeline.testing.scripted_server import ScriptedServer

    started: list[DagsterUI] = []

    def _start(*, sessions: int | None = None, ceiling_usd: float = 5.0) -> DagsterUI:
        trace_root = tmp_path / "projects"
        for i, proj in enumerate(sorted(SAMPLES.iterdir())):
            shutil.copytree(proj, trace_root / proj.name)
        if sessions is not None:  # keep only the first N main sessions (and their subagent files)
            proj = next(trace_root.iterdir())
            mains = sorted(proj.glob("*.jsonl"))
            mains = [m for m in mains if not m.name.startswith("agent-")]
            for m in mains[sessions:]:
                m.unlink()
                shutil.rmtree(m.with_suffix(""), ignore_errors=True)
        srv = ScriptedServer().start()
        teachers_yaml = write_teachers(tmp_path / "teachers.yaml", srv.url, ceiling_usd=ceiling_usd)
        store = tmp_path / "store"
        recipe = write_pipeline_recipe(tmp_path, trace_root=trace_root, store=store, teachers_yaml=teachers_yaml,
                                       tiny_model=tiny_model_dir)
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text(yaml.safe_dump({
            "run_queue": {"max_concurrent_runs": 1},
            "telemetry": {"enabled": False},
            "nux": {"enabled": False},
        }))
        port = _free_port()
        env = dict(os.environ, DAGSTER_HOME=str(home), COMPOSER_PIPELINE_RECIPE=str(recipe), OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1")
        log = tmp_path / "dagster-dev.log"
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w", str(REPO / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        ui = DagsterUI(f"http://127.0.0.1:{port}", home, trace_root, store, srv, proc, log, env)
        started.append(ui)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                urllib.request.urlopen(ui.url + "/server_info", timeout=2)
                ui.gql("{ workspaceOrError { ... on Workspace { locationEntries { name } } } }")
                break
            except Exception:
                time.sleep(1)
        else:
            raise AssertionError("dagster dev did not come up:\n" + log.read_text()[-4000:])
        ui.gql("mutation { setNuxSeen }")  # the 'Join the Dagster community' modal covers fresh UIs
        return ui

    yield _start
    for ui in started:
        try:
            os.killpg(ui.proc.pid, signal.SIGTERM)
            ui.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(ui.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ui.teachers.stop()
