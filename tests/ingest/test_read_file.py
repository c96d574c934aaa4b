"""parser.read_session_file: a file's bytes in one read, or the reason it cannot be read."""

from __future__ import annotations

import os

from composer_pipeline.ingest.parser import read_session_file


def test_reads_whole_files_and_names_what_cannot_be_read(tmp_path):
    big = tmp_path / "big.jsonl"
    body = b'{"type":"user"}\n' * 70_000  # > 1 MiB
    big.write_bytes(body)
    assert read_session_file(big) == (body, None)
    assert read_session_file(str(big)) == (body, None)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert read_session_file(empty) == (b"", None)
    assert read_session_file(tmp_path / "missing.jsonl") == (None, "unreadable file: No such file or directory")
    assert read_session_file(tmp_path) == (None, "not read: not a regular file")
    if os.geteuid() != 0:  # root reads anything
        big.chmod(0)
        assert read_session_file(big) == (None, "unreadable file: Permission denied")


def test_a_fifo_is_not_read(tmp_path):
    """A FIFO reports size 0 and would block a reader forever (no writer here): it is refused as not a
    regular file, at once (links and special files in the trace root are never read, issue 21)."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert read_session_file(fifo) == (None, "not read: not a regular file")
