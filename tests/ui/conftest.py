"""ONE real ``dagster dev`` for the whole UI test session (free loopback port, temporary DAGSTER_HOME,
its own process group) and one headless Debian Chromium driven by Playwright.

The journeys run in file order on that one instance and build on each other, as a user's day would:
a trace root of copies of the bundled sample sessions (more are added by the journeys), a store,
ledger and response cache, a scripted OpenAI-compatible teacher server on 127.0.0.1 (real HTTP; it
answers a ``Read`` tool call under two model names, so two distinct models agree and pairs exist), a
loopback teacher that runs start with ``composer-pipeline teachers serve`` (the offline tiny model),
and the tiny model for training. Screenshots land in ``artifacts/ui/`` (git-ignored).
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
from ui_kit import ARTIFACTS, LOCATION, REPO, SAMPLES, move_session, teacher_server_pids  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


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
    # sample sessions not in the trace root yet (journeys add them)
    spare: Path | None = None
    teachers_yaml: Path | None = None
    # ledger, cache, local teacher server pid files and logs
    state_dir: Path | None = None

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
        # dynamic partitions are read from the instance instead (no partition set for assets)
        del q
        from dagster import DagsterInstance

        with DagsterInstance.from_config(str(self.home)) as inst:
            return list(inst.get_dynamic_partitions("sessions"))


def write_pipeline_recipe(
    tmp: Path, *, trace_root: Path, store: Path, teachers_yaml: Path, tiny_model: Path, sensor_interval_s: int = 5
) -> Path:
    train = yaml.safe_load((REPO / "recipes" / "train.yaml").read_text())
    train["optim"]["steps"] = 2
    train_path = tmp / "train.yaml"
    train_path.write_text(yaml.safe_dump(train))
    recipe = {
        "trace_roots": [str(trace_root)],
        "store_root": str(store),
        "ledger_path": str(tmp / "state" / "ledger.sqlite"),
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


def write_teachers(
    path: Path, url: str, *, ceiling_usd: float = 5.0, local_url: str | None = None, tiny_model: Path | None = None
) -> Path:
    common = {
        "api_key_env": None,
        "input_usd_per_mtok": 1.0,
        "output_usd_per_mtok": 2.0,
        "budget_usd": 10.0,
        "max_concurrency": 2,
        "max_tokens": 64,
        "temperature": 0.0,
        "timeout_s": 30,
        "max_retries": 1,
    }
    # two model names on the scripted server: two distinct models (a vote is base_url + model)
    teachers = [
        {"name": name, "base_url": url, "model": model, **common}
        for name, model in (("teacher_a", "scripted-a"), ("teacher_b", "scripted-b"))
    ]
    doc: dict = {"ceiling_usd": ceiling_usd, "teachers": teachers}
    # a local model a run must start `teachers serve` for
    if local_url:
        teachers.append(
            {
                "name": "local_tiny",
                "base_url": local_url,
                "model": "tiny",
                **common,
                "max_tokens": 8,
                "input_usd_per_mtok": 0.1,
                "output_usd_per_mtok": 0.1,
                "temperature": 1.0,
                "seed": 7,
            }
            # sampled: a (nonsense) third answer, not an empty one
        )
        doc["serve"] = {"tiny": str(tiny_model)}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def browser():
    """Module-scoped on purpose: Playwright's sync API keeps an asyncio loop running in the main thread
    while it is open, so any later test that calls ``asyncio.run`` (replay, show) would fail if the
    browser outlived the journeys' module."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        "Debian chromium missing: the test command installs it (composer_pipeline.bootstrap)"
    )
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


@pytest.fixture(scope="session")
def ui(tmp_path_factory, tiny_model_dir):
    """ONE real ``dagster dev`` for the whole UI session, on a temporary DAGSTER_HOME.

    Trace root: the first sample session (the other two wait in ``spare`` for the journeys that add
    sessions). Teachers: two distinct models on the scripted loopback server (``scripted-a``,
    ``scripted-b``: they agree, so pairs exist) and a third on a loopback port where nothing answers
    until a run starts ``composer-pipeline teachers serve`` for it (the offline tiny model), so the
    local-server lifecycle is part of every journey. Tests that change the teachers recipe restore it.
    """
    from tests.support.scripted_server import ScriptedServer

    tmp = tmp_path_factory.mktemp("ui")
    trace_root, spare = tmp / "projects", tmp / "spare"
    proj = sorted(SAMPLES.iterdir())[0]
    shutil.copytree(proj, spare / proj.name)
    (trace_root / proj.name).mkdir(parents=True)
    # the first session (with its subagent files) is there from the start
    move_session(spare, trace_root)
    srv = ScriptedServer().start()
    local_port = _free_port()
    teachers_yaml = write_teachers(
        tmp / "teachers.yaml", srv.url, local_url=f"http://127.0.0.1:{local_port}/v1", tiny_model=tiny_model_dir
    )
    store = tmp / "store"
    recipe = write_pipeline_recipe(
        tmp, trace_root=trace_root, store=store, teachers_yaml=teachers_yaml, tiny_model=tiny_model_dir
    )
    home = tmp / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        yaml.safe_dump(
            {
                "run_queue": {"max_concurrent_runs": 1},
                "telemetry": {"enabled": False},
                "nux": {"enabled": False},
            }
        )
    )
    port = _free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        COMPOSER_PIPELINE_RECIPE=str(recipe),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    log = tmp / "dagster-dev.log"
    # its own process group, as a terminal would start it: Ctrl-C / SIGTERM reach every process of it
    proc = subprocess.Popen(
        [
            # SIGINT/SIGTERM at their defaults, as the README starts it (`env --default-signal=INT`): a signal
            # disposition the test process inherited (an ignored SIGINT) must not decide how it stops
            "env",
            "--default-signal=INT,TERM",
            str(Path(sys.executable).parent / "dagster"),
            "dev",
            "-w",
            str(REPO / "workspace.yaml"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    u = DagsterUI(
        f"http://127.0.0.1:{port}",
        home,
        trace_root,
        store,
        srv,
        proc,
        log,
        env,
        spare=spare,
        teachers_yaml=teachers_yaml,
        state_dir=tmp / "state",
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            urllib.request.urlopen(u.url + "/server_info", timeout=2)
            u.gql("{ workspaceOrError { ... on Workspace { locationEntries { name } } } }")
            break
        except Exception:
            time.sleep(1)
    else:
        raise AssertionError("dagster dev did not come up:\n" + log.read_text()[-4000:])
    # the 'Join the Dagster community' modal covers fresh UIs
    u.gql("mutation { setNuxSeen }")
    yield u
    # the shutdown test stops it itself; this is the fallback
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in teacher_server_pids(u.state_dir):
        os.kill(pid, signal.SIGKILL)
    srv.stop()
