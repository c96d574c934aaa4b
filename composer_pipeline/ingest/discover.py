"""Find Claude Code sessions and their subagent transcripts under a trace root.

In:  a directory (walked recursively) or a single ``.jsonl`` file.
Out: one :class:`SessionFiles` per session: the main file plus its subagent files in every layout
(2.0.x sibling ``agent-<id>.jsonl`` matched by the ``sessionId`` they carry, 2.1.x
``<session>/subagents/**/agent-*.jsonl``; 1.0.x inline sidechains live in the main file itself).

``key`` (the Dagster partition key) is the main file's path relative to the root without
``.jsonl``, ``/`` -> ``__``. Agent files whose parent session file is absent still form a session
(``main_file=None``) keyed by where the parent would be, so nothing is dropped.
Deliberately simplified: non-``agent-*`` files under ``subagents/`` (workflow journals) and
``tool-results/`` blobs are not sessions and are skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_SESSION_ID_RE = re.compile(rb'"sessionId"\s*:\s*"([^"]+)"')
_HEAD_BYTES = 65536


@dataclass
class SessionFiles:
    key: str
    root: Path
    main_file: Path | None
    subagent_files: list[Path] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return ([self.main_file] if self.main_file else []) + list(self.subagent_files)

    def rel(self, p: Path) -> str:
        root, path = str(self.root), str(p)
        if path.startswith(root) and path[len(root):len(root) + 1] == os.sep:  # (pathlib's relative_to is slow)
            return path[len(root) + 1:].replace(os.sep, "/")
        return p.relative_to(self.root).as_posix()


def session_key(rel_without_suffix: str) -> str:
    return rel_without_suffix.replace("\\", "/").replace("/", "__")


def _head_session_id(p: Path) -> str | None:
    try:
        with open(p, "rb") as f:
            m = _SESSION_ID_RE.search(f.read(_HEAD_BYTES))
    except OSError:
        return None
    return m.group(1).decode("utf-8", "replace") if m else None


def _is_agent(name: str) -> bool:
    return name.startswith("agent-") and name.endswith(".jsonl")


def discover_sessions(root: Path) -> list[SessionFiles]:
    root = Path(root)
    if root.is_file():
        return _discover_single(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no such trace path: {root}")
    sessions: dict[Path, SessionFiles] = {}  # keyed by the (would-be) main file path

    def get(main: Path) -> SessionFiles:
        sf = sessions.get(main)
        if sf is None:
            rel = main.relative_to(root).as_posix()[: -len(".jsonl")]
            sf = sessions[main] = SessionFiles(session_key(rel), root, main if main.is_file() else None)
        return sf

    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        d = Path(dirpath)
        parts = d.relative_to(root).parts
        if "tool-results" in parts:
            continue
        if "subagents" in parts:
            i = len(parts) - 1 - parts[::-1].index("subagents")
            owner = root.joinpath(*parts[:i])  # .../<session>/subagents/...
            if not parts[:i]:
                continue
            main = owner.parent / f"{owner.name}.jsonl"
            for name in sorted(filenames):
                if _is_agent(name):
                    get(main).subagent_files.append(d / name)
            continue
        mains = [n for n in sorted(filenames) if n.endswith(".jsonl") and not _is_agent(n)]
        # a file named <sessionId>.jsonl wins; otherwise the sessionId its first records carry
        # (a resumed session can start with records of the session it continues)
        by_sid: dict[str, Path] = {(d / n).stem: d / n for n in mains}
        for n in mains:
            p = d / n
            get(p)
            sid = _head_session_id(p)
            if sid:
                by_sid.setdefault(sid, p)
        for n in sorted(filenames):
            if not _is_agent(n):
                continue
            p = d / n
            sid = _head_session_id(p)
            main = by_sid.get(sid) if sid else None
            if main is None:  # parent session not here: keep the agent file as its own session
                main = d / f"{sid or p.stem}.jsonl"
            get(main).subagent_files.append(p)
    return sorted(sessions.values(), key=lambda s: s.key)


def _discover_single(path: Path) -> list[SessionFiles]:
    """A single file: itself (plus, for a main file, the subagent files that belong to it)."""
    root = path.parent
    if _is_agent(path.name):
        return [SessionFiles(session_key(path.stem), root, None, [path])]
    for sf in discover_sessions(root):
        if sf.main_file == path:
            return [sf]
    return [SessionFiles(session_key(path.stem), root, path, [])]


def session_fingerprint(sf: SessionFiles) -> str:
    """Hash of (path, size, mtime) of every file: changes when any file of the session changes."""
    h = hashlib.sha256(sf.key.encode())
    for p in sf.files:
        try:
            st = p.stat()
            h.update(f"|{p}|{st.st_size}|{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"|{p}|missing".encode())
    return h.hexdigest()[:32]
