"""Fixtures for `show`: each trace corpus and the shipped samples ingested once, and a small replayed +
paired store (from the project's own corpus) built through the real CLI against a recording
OpenAI-compatible server on loopback."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from composer_pipeline.cli import main
from composer_pipeline.store import Store
from tests.support.scripted_server import ScriptedServer

REPO = Path(__file__).resolve().parents[2]


def cli(*argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def _ingest(src: Path, out: Path) -> Path:
    rc, _, err = cli("ingest", src, "--out", out)
    assert rc == 0, err
    return out


@pytest.fixture(scope="session")
def corpus_store(corpus, tmp_path_factory) -> Path:
    """Each corpus (tests/conftest.py) ingested by `composer-pipeline ingest`."""
    return _ingest(corpus.root, tmp_path_factory.mktemp(f"show-{corpus.name}"))


@pytest.fixture(scope="session")
def project_store(project_corpus, tmp_path_factory) -> Path:
    """The project's own corpus ingested by `composer-pipeline ingest` (46 states, 1.0.x to 2.1.x)."""
    return _ingest(project_corpus.root, tmp_path_factory.mktemp("show-project"))


@pytest.fixture(scope="session")
def samples_store(tmp_path_factory) -> Path:
    """The synthetic sessions shipped in the package: compaction, interrupted calls, 2.1.x subagents dir."""
    return _ingest(REPO / "composer_pipeline" / "samples" / "projects", tmp_path_factory.mktemp("show-samples"))


def _pick_states(states) -> list[str]:
    """A handful of states covering every stream kind, parallel calls, errors and 2.1.x progress chains."""
    rows = states.to_pylist()
    picked: list[str] = []
    for kind in ("main", "inline_sidechain", "sibling_agent_file", "subagents_dir"):
        of_kind = sorted((r for r in rows if r["stream_kind"] == kind), key=lambda r: -r["n_prefix_messages"])
        picked += [r["state_id"] for r in of_kind[:2]]
    picked += [r["state_id"] for r in rows if r["has_error"]][:1]
    picked += [r["state_id"] for r in rows if r["version"].startswith("2.1")][-2:]
    return list(dict.fromkeys(picked))


@pytest.fixture(scope="session")
def replayed(project_store, tmp_path_factory):
    """A store with a few states replayed by two teachers over HTTP (requests recorded), then paired."""
    root = tmp_path_factory.mktemp("show-replayed")
    src, dst = Store(str(project_store)), Store(str(root / "run"))
    states = src.read_table("trace_states")
    ids = _pick_states(states)
    dst.write_table("trace_states", states.filter(pc.is_in(states.column("state_id"), value_set=pa.array(ids))))
    dst.write_table("trace_messages", src.read_table("trace_messages"))
    server = ScriptedServer().start()
    try:
        teacher = dict(
            base_url=server.url,
            api_key_env=None,
            input_usd_per_mtok=1.0,
            output_usd_per_mtok=2.0,
            budget_usd=10.0,
            max_concurrency=4,
            max_tokens=50,
            temperature=0.0,
            timeout_s=5.0,
            max_retries=1,
            backoff_s=0.02,
            backoff_max_s=0.1,
        )
        cfg = root / "teachers.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "ceiling_usd": 5.0,
                    "teachers": [
                        dict(name="alpha", model="scripted-a", **teacher),
                        dict(name="beta", model="scripted-b", **teacher),
                    ],
                }
            )
        )
        rc, out, err = cli(
            "replay",
            "--states",
            dst.root,
            "--teachers",
            cfg,
            "--out",
            dst.root,
            "--ledger",
            root / "ledger.sqlite",
            "--cache",
            root / "cache",
        )
        assert rc == 0, err
        # two model names on one server: two models to the pairs stage (a vote is base_url + model)
        rc, _, err = cli("pairs", "--replays", dst.root, "--states", dst.root, "--out", dst.root, "--teachers", cfg)
        assert rc == 0, err
        bodies = [r.body for r in server.requests]
    finally:
        server.stop()
    return {"root": dst.root, "teachers": cfg, "bodies": bodies, "state_ids": ids}
