"""files.read_session_file: a file's bytes in one read, or the reason it cannot be read."""

from __future__ import annotations

import os

from composer_pipeline.ingest.files import read_session_file


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


def test_discovery_reads_a_head_as_read_session_file_reads_a_file(tmp_path):
    """discover._head_session_id (an agent file's parent, read from its first 64 KiB) follows no link and
    opens no FIFO, and still finds a sessionId past its first 8 KiB read or cut by it."""
    from composer_pipeline.ingest.discover import _FIRST_READ, _head_session_id

    sid = "0a1b2c3d-1111-4a4a-8a8a-000000000001"
    line = b'{"type":"user","sessionId":"' + sid.encode() + b'"}\n'
    plain = tmp_path / "agent-a.jsonl"
    plain.write_bytes(line)
    assert _head_session_id(plain) == sid
    assert _head_session_id(str(plain)) == sid
    # the id past the first read, and cut by it
    for pad in (_FIRST_READ + 100, _FIRST_READ - 20):
        late = tmp_path / f"agent-late{pad}.jsonl"
        late.write_bytes(b'{"type":"summary","summary":"' + b"x" * pad + b'"}\n' + line)
        assert _head_session_id(late) == sid
    link = tmp_path / "agent-link.jsonl"
    link.symlink_to(plain)
    assert _head_session_id(link) is None
    fifo = tmp_path / "agent-fifo.jsonl"
    os.mkfifo(fifo)
    assert _head_session_id(fifo) is None
    assert _head_session_id(tmp_path) is None
    assert _head_session_id(tmp_path / "agent-missing.jsonl") is None
