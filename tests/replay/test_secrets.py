"""Secrets: the API key travels only in the Authorization header, never in bodies, call ids, the cache,
the ledger, Parquet, logs or reasons; secrets in sessions are scrubbed by ingest before any request."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from composer_pipeline.cli import main
from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, scripted_request, teacher_dict

KEY = "sk-or-v1-TESTSECRET-4f2a9c7e1b3d5f60718293a4b5c6d7e8"
SAMPLE_SECRET = re.compile(rb"sk-ant-api03-FAKE")  # planted in the shipped sample sessions


def _all_bytes(root: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in root.rglob("*") if p.is_file()]


def test_key_only_in_authorization_header(tmp_path, server, samples_dir, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("MY_TEACHER_KEY", KEY)
    monkeypatch.setenv("COMPOSER_PIPELINE_HOME", str(tmp_path / "home"))
    teachers = tmp_path / "teachers.yaml"
    teachers.write_text(
        yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict(server.url, api_key_env="MY_TEACHER_KEY")]})
    )
    rc = main(["replay", "--states", str(samples_dir), "--teachers", str(teachers), "--out", str(tmp_path / "out")])
    assert rc == 0
    out, err = capsys.readouterr()
    assert server.requests and all(r.authorization == f"Bearer {KEY}" for r in server.requests)
    for r in server.requests:
        assert KEY.encode() not in r.body
        assert not SAMPLE_SECRET.search(r.body), "a secret from the session reached a teacher"
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"}
    home = tmp_path / "home"
    files = _all_bytes(home) + _all_bytes(tmp_path / "out")
    assert any(p.suffix == ".sqlite" for p, _ in files) and any(p.suffix == ".json" for p, _ in files)
    for p, data in files:
        assert KEY.encode() not in data, p
    for text in (out, err, caplog.text):
        assert KEY not in text


def test_a_provider_echoing_the_key_is_scrubbed(tmp_path, server):
    cfg = make_config(server.url, api_key_env="X_KEY")
    res = replay_requests(
        [scripted_request(cfg, 0, "echoauth")],
        cfg,
        {"t1": KEY},
        cache=ResponseCache(tmp_path / "c"),
        ledger=Ledger(tmp_path / "l.sqlite"),
        run_id="r",
    )
    row = res.table.to_pylist()[0]
    assert row["status"] == "failed" and row["reason"].startswith("http_401") and "[REDACTED]" in row["reason"]
    assert KEY not in str(res.summary) and KEY not in str(row)
    for p in tmp_path.glob("l.sqlite*"):  # the database and its write-ahead log
        assert KEY.encode() not in p.read_bytes()


def test_a_teacher_answering_with_a_secret_is_scrubbed_before_cache_and_table(tmp_path, server):
    """A teacher that echoes or invents a key: the answer is scrubbed before the response cache, the
    replay table and any reason text see it (the ingest scrubber, applied to every string of the response)."""
    token = "ghp_" + "Zz9Yy8Xx7W" * 4
    cfg = make_config(server.url)
    cache = ResponseCache(tmp_path / "c")
    res = replay_requests(
        [scripted_request(cfg, 0, f"answer:use\\ntoken {token} now")],
        cfg,
        {},
        cache=cache,
        ledger=Ledger(tmp_path / "l.sqlite"),
        run_id="r",
    )
    row = res.table.to_pylist()[0]
    assert row["status"] == "answered" and "[REDACTED:github_token]" in str(row)
    assert token not in str(row)
    files = _all_bytes(tmp_path / "c")
    assert files and all(token.encode() not in data for _, data in files)
    assert any(b"[REDACTED:github_token]" in data for _, data in files)


def test_answers_are_scrubbed_off_the_event_loop(tmp_path, server, monkeypatch):
    """Scrubbing a long answer takes a while; on the event loop it stopped the run's heartbeat (a 400 KB
    answer of PEM headers blocked it ~35 s, past its lease). Every answer is scrubbed in a worker thread
    (the real scrub, watched: where it runs, and that its result is what is stored)."""
    import asyncio

    from composer_pipeline.replay import call as client

    where: list[bool] = []
    real = client._clean_answer

    def watched(data, api_key):
        try:
            asyncio.get_running_loop()
            where.append(True)
        # no loop in this thread: a worker thread
        except RuntimeError:
            where.append(False)
        return real(data, api_key)

    monkeypatch.setattr(client, "_clean_answer", watched)
    token = "ghp_" + "Qq9Ww8Ee7R" * 4
    cfg = make_config(server.url)
    res = replay_requests(
        [scripted_request(cfg, i, f"answer:token {token} -----BEGIN RSA PRIVATE KEY----- x") for i in range(3)],
        cfg,
        {},
        cache=ResponseCache(tmp_path / "c"),
        ledger=Ledger(tmp_path / "l.sqlite"),
        run_id="r",
    )
    rows = res.table.to_pylist()
    assert [r["status"] for r in rows] == ["answered"] * 3
    assert where == [False] * 3
    assert all(token not in str(r) and "[REDACTED:github_token] [REDACTED:private_key]" in str(r) for r in rows)


def test_a_raw_slash_in_a_postgresql_password_is_refused_before_libpq_quotes_it(tmp_path, capsys):
    """libpq ends a URL's host part at the first ``/``: ``postgresql://bob:s3cr3t/et9Pass@host/db`` became
    host ``bob``, port ``s3cr3t``, and its error quoted that "port" (the password's first characters),
    which no redaction of the whole password finds. Such a URL is refused with how to write it."""
    from composer_pipeline.ledger import LedgerError

    url = "postgresql://bob:s3cr3t/et9Pass@127.0.0.1:5432/ledger"
    try:
        Ledger(url).balance("t1", 1.0)
    except LedgerError as e:
        message = str(e)
    else:
        raise AssertionError("a ledger URL with a raw '/' in its password was accepted")
    assert "s3cr3t" not in message and "et9Pass" not in message
    assert "percent-encode" in message and "postgresql://bob:***@127.0.0.1:5432/ledger" in message
    teachers = tmp_path / "teachers.yaml"
    teachers.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict("http://127.0.0.1:9/v1")]}))
    assert main(["teachers", "budget", "--teachers", str(teachers), "--ledger", url]) == 2
    out, err = capsys.readouterr()
    assert "s3cr3t" not in out + err and "percent-encode" in err
