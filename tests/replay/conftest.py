"""Fixtures for the replay tests: a scripted OpenAI-compatible server on loopback, teacher configs,
requests carrying fault directives, and the synthetic sample sessions ingested once per session."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from composer_pipeline.replay.requests import ReplayRequest, make_request
from composer_pipeline.teachers.config import TeachersConfig, parse_teachers
from tests.support.scripted_server import ScriptedServer

REPO = Path(__file__).resolve().parents[2]


def teacher_dict(url: str, name: str = "t1", **over) -> dict:
    d = dict(
        name=name,
        base_url=url,
        model="scripted",
        api_key_env=None,
        input_usd_per_mtok=1.0,
        output_usd_per_mtok=2.0,
        budget_usd=10.0,
        max_concurrency=4,
        max_tokens=50,
        temperature=0.0,
        timeout_s=2.0,
        max_retries=2,
        backoff_s=0.02,
        backoff_max_s=0.1,
    )
    d.update(over)
    return d


def make_config(url: str, *, ceiling_usd: float = 10.0, teachers: list[dict] | None = None, **over) -> TeachersConfig:
    return parse_teachers({"ceiling_usd": ceiling_usd, "teachers": teachers or [teacher_dict(url, **over)]}, "test")


def scripted_request(
    cfg: TeachersConfig, i: int, script: str = "answer", teacher: int = 0, pad: int = 0
) -> ReplayRequest:
    msgs = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"task {i} {'x' * pad} [[script: {script}]]"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
            },
        }
    ]
    return make_request(f"state{i:04d}", "sess", cfg.teachers[teacher], msgs, tools)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path) -> str:
    """A fresh ledger on each backend: an SQLite file (the embedded default) and a new database on the
    session's real PostgreSQL server (started once, tests/postgres_server.py)."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    pg = request.getfixturevalue("postgres_server")
    return pg.create_database(f"ledger_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def server():
    srv = ScriptedServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def samples_dir(tmp_path_factory) -> Path:
    """The 3 synthetic demo sessions shipped in the package (22 states), ingested by the real CLI."""
    out = tmp_path_factory.mktemp("samples-ingested")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "ingest",
            str(REPO / "composer_pipeline/samples/projects"),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (out / "trace_states.parquet").is_file()
    return out


@pytest.fixture(scope="session")
def samples_tables(samples_dir):
    import pyarrow.parquet as pq

    return pq.read_table(samples_dir / "trace_states.parquet"), pq.read_table(samples_dir / "trace_messages.parquet")
