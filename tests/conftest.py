"""Fixtures shared by every test module: environment, the real traces, the tiny model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = Path(os.environ.get("COMPOSER_SHARED_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real Claude Code sessions beside the checkout (CI has them too)."""
    assert SHARED_TRACES.is_dir(), f"real traces not found at {SHARED_TRACES}"
    return SHARED_TRACES


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
    from composer_pipeline.train.tiny import build_tiny_model

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
