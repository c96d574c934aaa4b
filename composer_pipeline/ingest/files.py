"""A session file as ingest reads it: its bytes (:func:`read_session_file`, :func:`is_empty`) and its
format (:func:`detect_format`: a Claude Code session or a Codex rollout).

Apart from the readers (``parser.py`` and ``states.py``, the Python engine; ``codex.py``, the Codex
reader) because the compiled engine needs only these: an ingest the compiled engine reads whole imports
neither reader, nor the msgspec they load (``pipeline._readers``; ~0.007 CPU-s of every ingest process,
bench/RESULTS.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson

from composer_pipeline import codex_items

NOT_FOLLOWED = "not read: a symbolic link (links in the trace root are not followed)"
NOT_REGULAR = "not read: not a regular file"


def read_session_file(path: Path | str) -> tuple[bytes, None] | tuple[None, str]:
    """A session file's bytes, or ``(None, reason)`` when it cannot be read (a quarantine row, line 0).

    A symbolic link is not followed (it may lead out of the trace root: ``x.jsonl -> /etc/passwd``), and
    only a regular file is read (a FIFO would block). One ``read`` of the size ``fstat`` gives (plus one
    byte, to see a file that grew meanwhile), without pathlib's buffered reader: about half the per-file
    cost, which counts with many small agent files."""

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))  # (POSIX)
    except OSError as e:
        return None, NOT_FOLLOWED if os.path.islink(path) else f"unreadable file: {e.strerror or e}"
    try:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, NOT_REGULAR
            n = st.st_size
            data = os.read(fd, n + 1)
            # grew, shrank, or a read cut short (2 GiB per call): read to the end
            if len(data) != n:
                parts = [data]
                while chunk := os.read(fd, 1 << 24):
                    parts.append(chunk)
                data = b"".join(parts)
            return data, None
        finally:
            os.close(fd)
    except OSError as e:
        return None, f"unreadable file: {e.strerror or e}"


def is_empty(data: bytes) -> bool:
    """A 0-byte or all-whitespace file: no lines (isspace stops at the first other byte; strip would copy)."""
    return not data or data.isspace()


# the head of a file read to tell its format
DETECT_BYTES = 1 << 16
DETECT_LINES = 20  # parsed lines looked at, at most
_CLAUDE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "progress", "attachment", "file-history-snapshot", "queue-operation"}
)


def detect_format(data: bytes) -> str | None:
    """``claude``, ``codex``, or ``None`` (neither) from the first lines of a file. A file none of whose
    head lines parses is left to the Claude Code reader (which quarantines each line)."""
    parsed = start = 0
    # the first DETECT_BYTES, read in place (a slice would copy 64 KiB of every session's main file)
    limit = min(len(data), DETECT_BYTES)
    # (line by line: the first line nearly always decides)
    while start < limit:
        end = data.find(b"\n", start, limit)
        end = limit if end < 0 else end
        line, start = data[start:end], end + 1
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        parsed += 1
        if type(obj) is dict:
            if _is_codex_line(obj):
                return "codex"
            t = obj.get("type")
            if "uuid" in obj or "sessionId" in obj or "leafUuid" in obj or (type(t) is str and t in _CLAUDE_TYPES):
                return "claude"
        if parsed >= DETECT_LINES:
            break
    return None if parsed else "claude"


def _is_codex_line(obj: dict) -> bool:
    t = obj.get("type")
    # (a damaged line's list or object ``type`` names nothing, and is no set member)
    named = type(t) is str
    if named and t in codex_items.ROLLOUT_LINE_TYPES and type(obj.get("payload")) is dict:
        return True
    if "payload" in obj or "uuid" in obj:
        return False
    if obj.get("record_type") == "state" or (
        named and t in codex_items.RESPONSE_ITEMS and ("role" in obj or "call_id" in obj)
    ):
        return True
    return "id" in obj and "timestamp" in obj and "instructions" in obj and t is None  # early session meta
