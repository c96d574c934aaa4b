"""Fixtures shared by every test module: environment, the trace corpora, the tiny model.

Two corpora of Claude Code sessions:
* the project's own (``tests/support/traces.py``, written to a temporary directory), always;
* real third-party sessions, only when ``COMPOSER_REAL_TRACES`` names a directory of them (``.ci/run``
  does). Tests over them carry the ``real_traces`` marker; without the variable they are deselected
  and the summary says so. The fixture ``corpus`` runs a test once per corpus available.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parent.parent
# child processes the tests start (workers, servers, `python -m` helpers) import the test helpers as
# ``tests.support`` like the tests do: pytest's ``pythonpath`` setting reaches this process only
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
REAL_TRACES_ENV = "COMPOSER_REAL_TRACES"
_REAL = {"deselected": 0}

# Facts about the real corpus the tests were written against (sessions of Claude Code 1.0.98 to 2.1.39:
# three projects, 12 files), counted by hand; the project's own corpus states its own in traces.EXPECTED.
REAL_EXPECTED = {
    "total_states": 232,
    "kinds": {"main": 58, "inline_sidechain": 171, "sibling_agent_file": 3},
    "unlinked_subagent_states": 0,
    "min_tool_calls": 500,
    "min_parallel_calls": 20,  # over every state's rendered prefix
    "min_typed_lines": 700,
    "min_assistant_lines": 100,
    "pairs_subdir": "marot__spotter",
}


@dataclass(frozen=True)
class Corpus:
    """A directory of Claude Code sessions and the facts the tests expect of it."""

    name: str  # "project" (ours) | "real"
    root: Path
    expect: dict = field(default_factory=dict)


def pytest_configure(config):
    real = os.environ.get(REAL_TRACES_ENV)
    if real and not Path(real).is_dir():
        raise pytest.UsageError(f"{REAL_TRACES_ENV}={real} is not a directory")


def pytest_collection_modifyitems(config, items):
    if os.environ.get(REAL_TRACES_ENV):
        return
    keep, skipped = [], []
    for item in items:
        (skipped if item.get_closest_marker("real_traces") else keep).append(item)
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = keep
        _REAL["deselected"] = len(skipped)


def pytest_terminal_summary(terminalreporter):
    real = os.environ.get(REAL_TRACES_ENV)
    if real:
        terminalreporter.write_line(f"real-traces layer: ran over {real}")
    else:
        terminalreporter.write_line(
            f"real-traces layer: NOT RUN ({_REAL['deselected']} tests deselected); set {REAL_TRACES_ENV} to a "
            "directory of Claude Code sessions to run it",
            yellow=True,
            bold=True,
        )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def project_corpus(tmp_path_factory) -> Corpus:
    """The project's own synthetic sessions (every format feature; see tests/support/traces.py)."""
    from tests.support.traces import EXPECTED, write_corpus

    return Corpus("project", write_corpus(tmp_path_factory.mktemp("corpus")), EXPECTED)


@pytest.fixture(scope="session")
def real_traces() -> Path:
    """The real sessions named by COMPOSER_REAL_TRACES (only tests marked ``real_traces`` use it)."""
    return Path(os.environ[REAL_TRACES_ENV])


@pytest.fixture(scope="session", params=["project", pytest.param("real", marks=pytest.mark.real_traces)])
def corpus(request) -> Corpus:
    """Each corpus in turn: ours always, the real one when COMPOSER_REAL_TRACES names it."""
    if request.param == "project":
        return request.getfixturevalue("project_corpus")
    return Corpus("real", request.getfixturevalue("real_traces"), REAL_EXPECTED)


S3_BUCKETS = ("composer-test", "pairs-test", "ingest-test", "train-test")


@pytest.fixture(scope="session")
def moto_s3():
    """One real S3-protocol server (moto) on 127.0.0.1 for the session, with the test buckets made.

    Sets ``AWS_ENDPOINT_URL`` and dummy credentials (s3fs and boto3 read them) and yields the endpoint.
    """
    import socket

    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    for bucket in S3_BUCKETS:
        client.create_bucket(Bucket=bucket)
    s3fs.S3FileSystem.clear_instance_cache()
    yield env["AWS_ENDPOINT_URL"]
    s3fs.S3FileSystem.clear_instance_cache()
    mp.undo()
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """One offline tiny causal LM + tokenizer for the whole test session."""
    from composer_pipeline.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(out)
    return out


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server on 127.0.0.1 for the whole test session (see tests/postgres_server.py)."""
    from postgres_server import PostgresServer

    with PostgresServer() as pg:
        yield pg


@pytest.fixture(scope="session")
def postgres_url(postgres_server) -> str:
    """URL of the session's PostgreSQL server (database ``postgres``)."""
    return postgres_server.url


_EXIT_STATUS = {"code": 0}


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS["code"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the process right after pytest's summary line.

    At interpreter shutdown duckdb's nanobind bindings print hundreds of "leaked instance" lines
    (objects still referenced by library caches at exit, not a test failure), burying the summary
    line that CI reads. Everything the tests started has been torn down by now.
    """
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS["code"])
