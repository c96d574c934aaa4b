"""`composer-pipeline replay` when things around it are wrong: a teacher answering 200 + HTML is cut
off (rows say why, stderr names it, exit 1); missing key variables, unknown hosts and an unwritable
``--out`` stop the run before any call (exit 2, named); a read-only or full response cache loses no
paid answer (they reach the output and the next run takes them from the ledger, paying nothing)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from composer_pipeline.cli import main
from composer_pipeline.ledger import Ledger
from tests.support.scripted_server import ScriptedServer

from .conftest import teacher_dict


def _yaml(tmp_path, teachers: list[dict], name: str = "teachers.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": teachers}))
    return str(p)


def _args(samples_dir, teachers, tmp_path, out="out", cache="cache") -> list[str]:
    return [
        "replay",
        "--states",
        str(samples_dir),
        "--teachers",
        teachers,
        "--out",
        str(tmp_path / out),
        "--ledger",
        str(tmp_path / "ledger.sqlite"),
        "--cache",
        str(tmp_path / cache),
    ]


@pytest.fixture
def html_server():
    srv = ScriptedServer().start()
    srv.default_script = ["html"]
    yield srv
    srv.stop()


def test_teacher_answering_html_is_cut_off(tmp_path, server, html_server, samples_dir, samples_tables, capsys):
    states, _ = samples_tables
    teachers = _yaml(
        tmp_path, [teacher_dict(html_server.url, "broken", max_concurrency=1), teacher_dict(server.url, "good")]
    )
    rc = main(_args(samples_dir, teachers, tmp_path))
    _, err = capsys.readouterr()
    assert rc == 1 and "teacher broken was cut off" in err
    # max_invalid_responses, then no more money is risked on it
    assert len(html_server.requests) == 3
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    broken = [r for r in rows if r["teacher"] == "broken"]
    assert len(broken) == states.num_rows and all(r["status"] == "failed" for r in broken)
    assert sum(r["reason"].startswith("invalid_json") and "<!DOCTYPE html>" in r["reason"] for r in broken) == 3
    assert (
        sum(r["reason"].startswith("teacher_disabled: 3 consecutive invalid responses") for r in broken)
        == states.num_rows - 3
    )
    assert {r["status"] for r in rows if r["teacher"] == "good"} == {"answered"}
    bal = Ledger(tmp_path / "ledger.sqlite").balance("broken", 10.0)
    # each HTML answer may have been billed: kept at worst case
    assert bal.kept_calls == 3 and bal.reserved_usd == 0


def test_preflight_stops_before_any_call(tmp_path, server, samples_dir, capsys, monkeypatch):
    monkeypatch.delenv("MY_MISSING_KEY", raising=False)
    teachers = _yaml(tmp_path, [teacher_dict(server.url, "t1", api_key_env="MY_MISSING_KEY")])
    assert main(_args(samples_dir, teachers, tmp_path)) == 2
    assert "environment variable MY_MISSING_KEY is not set" in capsys.readouterr().err
    teachers = _yaml(tmp_path, [teacher_dict("http://no-such-host.invalid:9/v1", "t1")])
    assert main(_args(samples_dir, teachers, tmp_path)) == 2
    assert "unknown host 'no-such-host.invalid'" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    teachers = _yaml(tmp_path, [teacher_dict(server.url, "t1")])
    assert main(_args(samples_dir, teachers, tmp_path, out="afile/out")) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path / 'afile' / 'out'} is not writable" in err and "nothing was sent" in err
    assert server.requests == [] and not list((tmp_path / "out").glob("*.parquet"))


def test_cache_path_unusable_loses_no_paid_answer(tmp_path, server, samples_dir, samples_tables, capsys):
    states, _ = samples_tables
    # the cache cannot be created nor written
    (tmp_path / "cache").write_text("not a directory")
    teachers = _yaml(tmp_path, [teacher_dict(server.url, "t1")])
    assert main(_args(samples_dir, teachers, tmp_path)) == 0
    out, err = capsys.readouterr()
    s1 = json.loads(out.strip().splitlines()[-1])
    assert "warning: response cache" in err and s1["answered"] == states.num_rows and s1["total_spend"] > 0
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert all(r["status"] == "answered" and "cache_error" in r["reason"] for r in rows)
    n = len(server.requests)
    assert main(_args(samples_dir, teachers, tmp_path, out="out2")) == 0  # the next run: answers from the ledger
    s2 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(server.requests) == n and s2["calls"] == 0 and s2["shared_answers"] == states.num_rows
    assert s2["total_spend"] == 0 and s2["answered"] == states.num_rows


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["readonly", "full"])
def test_readonly_or_full_cache_mount(tmp_path, server, samples_dir, samples_tables, kind):
    """A real read-only bind mount / a full tmpfs over the cache (a private mount namespace: root is not
    stopped by permission bits)."""
    states, _ = samples_tables
    cache = tmp_path / "cache"
    cache.mkdir()
    teachers = _yaml(tmp_path, [teacher_dict(server.url, "t1")])
    cmd = shlex.join([sys.executable, "-m", "composer_pipeline", *_args(samples_dir, teachers, tmp_path)])
    c = shlex.quote(str(cache))
    setup = (
        f"mount --bind {c} {c} && mount -o remount,ro,bind {c} {c}"
        if kind == "readonly"
        else f"mount -t tmpfs -o size=64k tmpfs {c} && (dd if=/dev/zero of={c}/fill bs=4k 2>/dev/null || true)"
    )
    p = subprocess.run(
        ["unshare", "-m", "bash", "-c", f"{setup} && exec {cmd}"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning: response cache" in p.stderr
    s1 = json.loads(p.stdout.strip().splitlines()[-1])
    assert s1["answered"] == states.num_rows and s1["total_spend"] > 0
    n = len(server.requests)
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", *_args(samples_dir, teachers, tmp_path, out="out2")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    s2 = json.loads(p.stdout.strip().splitlines()[-1])
    assert (
        p.returncode == 0 and len(server.requests) == n and s2["total_spend"] == 0 and s2["answered"] == states.num_rows
    )


def test_a_run_where_every_call_fails_exits_non_zero(tmp_path, server, samples_dir, samples_tables, capsys):
    states, _ = samples_tables
    # every request refused by the provider (not retried, not billed)
    server.default_script = ["400"]
    teachers = _yaml(tmp_path, [teacher_dict(server.url, "t1")])
    assert main(_args(samples_dir, teachers, tmp_path)) == 1
    out, err = capsys.readouterr()
    assert "no call was answered (http_400" in err
    s = json.loads(out.strip().splitlines()[-1])
    assert s["failed"] == states.num_rows and s["total_spend"] == 0
    assert Ledger(tmp_path / "ledger.sqlite").balance("t1", 10.0).spent_usd == 0  # released, never charged
