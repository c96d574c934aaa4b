"""The ingest CLI's row groups: trace_messages one per flush (FLUSH_ROWS messages), and the tables with
fewer rows per message, trace_states and quarantine, held over flushes into row groups of HELD_ROWS rows
(issue 35 §4: each column chunk costs the Parquet writer a compression context per page and more), with
the same rows in the same order."""

from __future__ import annotations

import pyarrow.parquet as pq

from composer_pipeline import cli
from composer_pipeline.cli import ingest as ingest_cli
from tests.support.sessions import Session, text, uid

TABLES = ("trace_states", "trace_messages", "quarantine")


def _sessions(root, n: int) -> None:
    """``n`` sessions of three answered questions (three states, six messages) and one damaged line each."""
    for k in range(n):
        sid = uid()
        s = Session(sid=sid)
        for i in range(3):
            s.user(f"question {k}.{i}")
            s.assistant(text(f"answer {k}.{i}"))
        s.raw('{"type":"user","uuid":')  # cut mid-write: a quarantine row
        s.write(root / "p" / f"{sid}.jsonl")


def _row_groups(path) -> list[int]:
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def test_states_and_bad_lines_are_held_into_row_groups_of_held_rows_with_the_same_rows(tmp_path, monkeypatch):
    _sessions(tmp_path / "root", 12)
    # a flush every second session (12 messages), a row group of states every second flush (12 >= 10) and
    # of quarantine rows every fifth (10 >= 10)
    monkeypatch.setattr(ingest_cli, "FLUSH_ROWS", 7)
    monkeypatch.setattr(ingest_cli, "HELD_ROWS", 10)
    assert cli.main(["ingest", str(tmp_path / "root"), "--out", str(tmp_path / "held")]) == 0
    held = {t: _row_groups(tmp_path / "held" / f"{t}.parquet") for t in TABLES}
    assert held["trace_messages"] == [12] * 6
    assert held["trace_states"] == [12] * 3
    assert held["quarantine"] == [10, 2]

    # the same rows, in the same order, as a row group per flush for every table
    monkeypatch.setattr(ingest_cli, "HELD_TABLES", ())
    assert cli.main(["ingest", str(tmp_path / "root"), "--out", str(tmp_path / "per_flush")]) == 0
    assert _row_groups(tmp_path / "per_flush" / "trace_states.parquet") == [6] * 6
    for t in TABLES:
        assert pq.read_table(tmp_path / "held" / f"{t}.parquet").equals(
            pq.read_table(tmp_path / "per_flush" / f"{t}.parquet")
        ), t


def test_held_rows_are_written_at_flush_bytes_too(tmp_path, monkeypatch):
    """FLUSH_BYTES bounds what is held, as it bounds a flush (sessions with very large lines)."""
    _sessions(tmp_path / "root", 4)
    monkeypatch.setattr(ingest_cli, "FLUSH_ROWS", 7)
    monkeypatch.setattr(ingest_cli, "HELD_ROWS", 1000)
    monkeypatch.setattr(ingest_cli, "FLUSH_BYTES", 1)
    assert cli.main(["ingest", str(tmp_path / "root"), "--out", str(tmp_path / "out")]) == 0
    assert _row_groups(tmp_path / "out" / "trace_states.parquet") == [3] * 4
