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
    assert read_session_file(tmp_path) == (None, "unreadable file: Is a directory")
    if os.geteuid() != 0:  # root reads anything
        big.chmod(0)
        assert read_session_file(big) == (None, "unreadable file: Permission denied")


def test_a_file_that_is_not_what_fstat_said_is_read_to_its_end(tmp_path):
    """A FIFO reports size 0 and delivers more: the read goes on to the end (as for a file that grew)."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # the writer
        with open(fifo, "wb") as f:
            f.write(b"x" * 300_000)
        os._exit(0)
    try:
        assert read_session_file(fifo) == (b"x" * 300_000, None)
    finally:
        os.waitpid(pid, 0)
