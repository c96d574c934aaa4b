"""Checks that run before a replay spends anything: every problem a call would only discover one
request at a time (and, for some, after paying) is found first and named.

In:  the teachers config, the API keys found (teacher → value or None), the teachers that will really be
     called (those with answers not yet cached), and local paths the run must write.
Out: :func:`preflight` raises :class:`PreflightError` (a ``ValueError``: the CLI exits 2) naming the
     environment variable, the host or the path; nothing is sent before it passes.

Checked: a teacher's ``api_key_env`` is set; its ``base_url`` host resolves; each output directory can
be created and written (a 64 KiB probe file is written, synced and removed: a full disk fails too). Deliberately not checked: that the key
is valid or the server answers (a request would be needed; the client's retries and cut-off handle it).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from composer_pipeline.teachers.config import TeachersConfig


class PreflightError(ValueError):
    """Something that would make every call fail or every answer unwritable; nothing was sent."""


def check_writable(path: str | Path, what: str) -> None:
    """Create ``path`` (a directory) if needed and write + remove a probe file in it."""
    p = Path(path).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=p)
        try:
            # real bytes, synced: an empty file would pass on a full disk
            os.write(fd, b"\0" * 65536)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise PreflightError(
            f"{what} {p} is not writable: {e.strerror or type(e).__name__} (nothing was sent)"
        ) from None


def preflight(
    config: TeachersConfig,
    api_keys: dict[str, str | None],
    *,
    teachers: set[str] | None = None,
    writable: Mapping[str, str | Path] | None = None,
) -> None:
    """Raise :class:`PreflightError` listing every problem; ``teachers`` = names that will be called (None: all)."""
    problems: list[str] = []
    for what, path in (writable or {}).items():
        try:
            check_writable(path, what)
        except PreflightError as e:
            problems.append(str(e))
    hosts: dict[str, list[str]] = {}
    for t in config.teachers:
        if teachers is not None and t.name not in teachers:
            continue
        if t.api_key_env and not api_keys.get(t.name):
            problems.append(f"teacher {t.name}: environment variable {t.api_key_env} is not set (its API key)")
        host = urlsplit(t.base_url).hostname or ""
        hosts.setdefault(host, []).append(t.name)
    for host, names in sorted(hosts.items()):
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as e:
            problems.append(f"teacher {', '.join(names)}: unknown host {host!r} ({getattr(e, 'strerror', None) or e})")
    if problems:
        raise PreflightError("pre-flight failed, nothing was sent:\n  " + "\n  ".join(problems))
