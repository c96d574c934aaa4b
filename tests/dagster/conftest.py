"""Fixtures of the Dagster tests (helpers: dagster_sessions.py)."""

from pathlib import Path

import pytest
from dagster_sessions import SESSION_ID, write_session


@pytest.fixture
def trace_root(tmp_path) -> Path:
    root = tmp_path / "projects"
    write_session(root, "-home-dev-proj", SESSION_ID)
    return root


@pytest.fixture
def scripted_server():
    from tests.support.scripted_server import ScriptedServer

    srv = ScriptedServer().start()
    yield srv
    srv.stop()
