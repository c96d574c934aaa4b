"""Sessions from a team: ``sessions push`` (scrubbed copies only, re-push sends what changed) and an
``s3://`` trace root (ingest, sensor scan; new or changed objects by ETag and size), against the
loopback S3 server the suite starts (moto, ``moto_s3``)."""

from __future__ import annotations

import json
import os

import boto3
import pyarrow.parquet as pq
import pytest

from composer_pipeline.ingest import remote
from tests.support.sessions import Session, text, tool

from . import codex_fixtures as fx

BUCKET = "team-sessions"
CLAUDE_KEY = "sk-ant-api03-" + "ClAuDeLaPtOp" * 4
# Claude Code names a project folder after its cwd
DIR_KEY = "ghp_" + "DiRnAmE1" * 5


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """The CLI in this process (its start-up is most of a subprocess's time), home in ``tmp_path``."""
    from composer_pipeline.cli import main

    monkeypatch.setenv("COMPOSER_PIPELINE_HOME", str(tmp_path / "home"))

    def run(*args) -> str:
        capsys.readouterr()
        assert main([str(a) for a in args]) == 0
        return capsys.readouterr().out

    return run


def _bucket_objects(client, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


@pytest.fixture
def laptop(tmp_path):
    """Two local roots: a Claude Code project (a key in a tool call) and a Codex day (every planted key)."""
    claude_root, codex_root = tmp_path / "claude", tmp_path / "codex"
    s = Session()
    s.user("deploy it")
    s.assistant(tool("Bash", "toolu_1", command=f"ANTHROPIC_API_KEY={CLAUDE_KEY} make deploy"))
    s.user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}])
    s.assistant(text("Deployed."))
    s.write(claude_root / f"-home-dev-{DIR_KEY}-app" / "5e5510e0-0000-4000-8000-000000000000.jsonl")
    fx.write(codex_root, "exec")
    return claude_root, codex_root


@pytest.fixture
def s3(moto_s3):
    client = boto3.client("s3", endpoint_url=moto_s3)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for key in _bucket_objects(client, ""):
        client.delete_object(Bucket=BUCKET, Key=key)
    client.delete_bucket(Bucket=BUCKET)


def test_push_sends_scrubbed_copies_only_and_repush_sends_what_changed(laptop, s3, cli):
    claude_root, codex_root = laptop
    to = f"s3://{BUCKET}/laptop1"
    first = json.loads(cli("sessions", "push", "--to", to, "--root", claude_root, "--root", codex_root))
    assert first["uploaded"] == 2 and first["unchanged"] == 0
    assert first["secrets_scrubbed"].get("url_credentials") == 1
    objects = _bucket_objects(s3, "laptop1/")
    assert len(objects) == 2 and not any(DIR_KEY in k for k in objects), list(objects)
    everything = b"".join(objects.values()).decode()
    assert "[REDACTED:" in everything
    for key in (CLAUDE_KEY, DIR_KEY, *fx.PLANTED):
        assert key not in everything, key
    again = json.loads(cli("sessions", "push", "--to", to, "--root", claude_root, "--root", codex_root))
    assert again["uploaded"] == 0 and again["unchanged"] == 2
    rollout = next(codex_root.rglob("*.jsonl"))
    with rollout.open("a") as f:
        f.write(fx.exec_()[-1] + "\n")
    changed = json.loads(cli("sessions", "push", "--to", to, "--root", claude_root, "--root", codex_root))
    assert changed["uploaded"] == 1 and changed["unchanged"] == 1
    # a touched file whose scrubbed bytes are the same is read but not sent again
    os.utime(rollout)
    touched = json.loads(cli("sessions", "push", "--to", to, "--root", claude_root, "--root", codex_root))
    assert touched["uploaded"] == 0


def test_an_s3_trace_root_ingests_and_picks_up_changed_objects(laptop, s3, cli, tmp_path):
    claude_root, codex_root = laptop
    to = f"s3://{BUCKET}/team"
    cli("sessions", "push", "--to", to, "--root", claude_root, "--root", codex_root)
    out = tmp_path / "out"
    cli("ingest", to, "--out", out)
    states = pq.read_table(out / "trace_states.parquet")
    assert sorted(set(states.column("source").to_pylist())) == ["claude", "codex"]
    assert states.num_rows == 2 + fx.STEPS["exec"]
    dumped = json.dumps(
        [pq.read_table(out / f"{t}.parquet").to_pylist() for t in ("trace_states", "trace_messages")], default=str
    )
    for key in (CLAUDE_KEY, *fx.PLANTED):
        assert key not in dumped

    # the sensor's scan: one changed object -> one changed fingerprint; a deleted one -> gone
    from assets.sensors import scan_sessions

    before = scan_sessions([to])
    rep = remote.mirror(to)
    assert rep.downloaded == 0 and rep.unchanged == 2
    objects = _bucket_objects(s3, "team/")
    codex_obj = next(k for k in objects if "rollout-" in k)
    s3.put_object(Bucket=BUCKET, Key=codex_obj, Body=objects[codex_obj] + (fx.exec_()[-1] + "\n").encode())
    after = scan_sessions([to])
    assert [k for k in before if before[k] != after[k]] == [next(k for k in before if "rollout-" in k)]
    s3.delete_object(Bucket=BUCKET, Key=codex_obj)
    assert len(scan_sessions([to])) == 1
