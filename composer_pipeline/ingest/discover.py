"""Find Claude Code sessions and their subagent transcripts under a trace root.

In:  a directory (walked recursively) or a single ``.jsonl`` file.
Out: one :class:`SessionFiles` per session: the main file plus its subagent files in every layout
(2.0.x sibling ``agent-<id>.jsonl`` matched by the ``sessionId`` they carry, 2.1.x
``<session>/subagents/**/agent-*.jsonl``; 1.0.x inline sidechains live in the main file itself).

``key`` (the session key; the Dagster partition key is its short form, ``partition_keys.py``) is the main file's path relative to the root without
``.jsonl``, ``/`` -> ``__``. Names taken from paths (``key``, and :meth:`SessionFiles.rel`, the
``source_file`` and ``stream_id`` of every row) are cleaned component by component (:func:`clean_name`):
a secret in a directory or file name (Claude Code names a project folder after its ``cwd``) becomes
``[REDACTED:<kind>]``, and a byte that is not UTF-8 (a file name from another encoding) becomes
``%XX``; a changed component gets ``~`` + 8 hex of its original bytes' sha256, so two different
names never clean to one key (deterministic: the same file keeps its key). Agent files whose parent session file is absent still form a session
(``main_file=None``) keyed by where the parent would be, so nothing is dropped. A ``sessionId``
holding a secret is not used (it would reach keys and paths unscrubbed): the file names its session.
Symbolic links are not followed: a linked directory is not walked (``os.walk``), and a linked
``.jsonl`` file is listed but not read (a quarantine row says so: ``files.read_session_file``), so
nothing outside the root is ingested; a file named on the command line is read where it leads.
Deliberately simplified: non-``agent-*`` files under ``subagents/`` (workflow journals) and
``tool-results/`` blobs are not sessions and are skipped.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

_SESSION_ID_RE = re.compile(rb'"sessionId"\s*:\s*"([^"]+)"')
_HEAD_BYTES = 65536
# the first record usually carries it: read more only when it does not
_FIRST_READ = 8192


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
        """``p`` relative to the root, ``/``-separated, cleaned (:func:`clean_name`): what rows record."""
        root, path = str(self.root), str(p)
        if path.startswith(root) and path[len(root) : len(root) + 1] == os.sep:  # (pathlib's relative_to is slow)
            return clean_name(path[len(root) + 1 :].replace(os.sep, "/"))
        return clean_name(p.relative_to(self.root).as_posix())


def session_key(rel_without_suffix: str) -> str:
    return clean_name(rel_without_suffix.replace("\\", "/")).replace("/", "__")


# what Claude Code names files and folders: nothing in them to clean (the common case, skipped fast)
# (a UUID, agent-<id>, or a name of 16 letters/digits: too short for any key)
_PLAIN = re.compile(
    r"(?:agent-)?(?:[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|[0-9A-Za-z]{1,16})(?:\.jsonl)?"
)


def clean_name(rel: str) -> str:
    """A ``/``-separated relative path with each component cleaned (:func:`_clean_part`)."""
    head, sep, name = rel.rpartition("/")
    return _clean_dir(head) + sep + (name if _PLAIN.fullmatch(name) else _clean_part(name))


# a project's folder repeats for each of its files
@functools.lru_cache(maxsize=4096)
def _clean_dir(head: str) -> str:
    return "/".join(c if _PLAIN.fullmatch(c) else _clean_part(c) for c in head.split("/")) if head else ""


# a name repeats across folders (a project's name under each root)
@functools.lru_cache(maxsize=4096)
def _clean_part(part: str) -> str:
    """One path component as ids may hold it: secrets redacted, undecodable bytes (``os`` hands them over
    as lone surrogates) as ``%XX``; when that changed anything, ``~`` + 8 hex of the original bytes'
    sha256 (before a ``.jsonl`` suffix), so distinct names stay distinct."""
    stem, suffix = (part[:-6], ".jsonl") if part.endswith(".jsonl") else (part, "")
    raw = os.fsencode(stem)
    text = raw.decode("utf-8", "surrogateescape")
    text = "".join(f"%{ord(ch) - 0xDC00:02X}" if "\udc80" <= ch <= "\udcff" else ch for ch in text)
    text = _scrubber().scrub(text)
    if text == stem:
        return part
    return f"{text}~{hashlib.sha256(raw).hexdigest()[:8]}{suffix}"


def _head_session_id(p: str | Path) -> str | None:
    """The first ``sessionId`` in the first 64 KiB of a file (summary and snapshot records carry none)."""
    # a link is not followed and only a regular file is read (files.read_session_file): one open that
    # refuses a link and a stat of what it opened, instead of two stats and a buffered file object
    try:
        fd = os.open(p, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = _read_up_to(fd, _FIRST_READ)
        m = _SESSION_ID_RE.search(head)
        # not found yet, or the match may run past the read
        if m is None or m.end() == len(head):
            head += _read_up_to(fd, _HEAD_BYTES - len(head))
            m = _SESSION_ID_RE.search(head)
    except OSError:
        return None
    finally:
        os.close(fd)
    if m is None:
        return None
    sid = m.group(1).decode("utf-8", "replace")
    # read before scrubbing and used in session keys and paths: a value holding a secret is no id
    # (what Claude Code writes: no secret fits in one)
    if _UUID.fullmatch(sid):
        return sid
    return None if _scrubber().scrub(sid) != sid else sid


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# (POSIX) a FIFO opens without blocking, and is then refused as not a regular file
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _read_up_to(fd: int, n: int) -> bytes:
    """``n`` bytes from ``fd``, fewer only at the end of the file (as a buffered ``read(n)``)."""
    parts = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


_SCRUBBER = None


def _scrubber():
    global _SCRUBBER
    if _SCRUBBER is None:
        from composer_pipeline.scrub import Scrubber

        _SCRUBBER = Scrubber()
    return _SCRUBBER


def _is_agent(name: str) -> bool:
    return name.startswith("agent-") and name.endswith(".jsonl")


def discover_sessions(root: Path) -> list[SessionFiles]:
    root = Path(root)
    # a file named by the user is read where its link (if it is one) leads
    if root.is_file():
        return _discover_single(Path(os.path.realpath(root)) if root.is_symlink() else root)
    if not root.is_dir():
        raise FileNotFoundError(f"no such trace path: {root}")
    # paths are handled as strings here (pathlib's parsing was most of the cost on many small files);
    # every file becomes a Path once, in its SessionFiles
    root_s = os.fspath(root)
    sep = os.sep
    prefix = root_s if root_s.endswith(sep) else root_s + sep  # (root "/" ends with it already)
    sessions: dict[str, SessionFiles] = {}  # keyed by the (would-be) main file path

    def get(main: str, known_file: bool) -> SessionFiles:
        sf = sessions.get(main)
        if sf is None:
            rel = main[len(prefix) : -len(".jsonl")].replace(sep, "/")
            # an agent-*.jsonl is never a main file: an agent file without a sessionId names the
            # session after itself, and must not also be ingested as its own parent
            is_file = known_file or (not _is_agent(os.path.basename(main)) and os.path.isfile(main))
            sf = sessions[main] = SessionFiles(session_key(rel), root, Path(main) if is_file else None)
        return sf

    for dirpath, dirnames, filenames in os.walk(root_s):
        dirnames.sort()
        parts = dirpath[len(prefix) :].split(sep) if dirpath != root_s else []
        if "tool-results" in parts:
            continue
        if "subagents" in parts:
            i = len(parts) - 1 - parts[::-1].index("subagents")
            if not parts[:i]:
                continue
            main = prefix + sep.join([*parts[: i - 1], parts[i - 1] + ".jsonl"])  # .../<session>/subagents/...
            for name in sorted(filenames):
                if _is_agent(name):
                    get(main, False).subagent_files.append(Path(dirpath + sep + name))
            continue
        mains = [n for n in sorted(filenames) if n.endswith(".jsonl") and not _is_agent(n)]
        # a file named <sessionId>.jsonl wins; otherwise the sessionId its first records carry
        # (a resumed session can start with records of the session it continues)
        by_sid: dict[str, str] = {n[: -len(".jsonl")]: dirpath + sep + n for n in mains}
        # (a symlink or special file too: reading it is refused with a reason, not skipped)
        for n in mains:
            get(dirpath + sep + n, True)
        for main, p in _agent_file_parents(dirpath + sep, filenames, mains, by_sid):
            get(main, False).subagent_files.append(Path(p))
    return sorted(sessions.values(), key=lambda s: s.key)


def _agent_file_parents(
    dir_prefix: str, filenames: list[str], mains: list[str], by_sid: dict[str, str]
) -> list[tuple[str, str]]:
    """``(main file path, agent file path)`` for each agent-*.jsonl of one directory (``dir_prefix`` ends with
    the separator): the main file named by the agent file's sessionId, else the main file whose first records
    carry that sessionId, else a session of its own. ``by_sid`` (file name stem -> path) gains the heads."""
    out = []
    # the main files' own sessionIds: read only for an agent file no file name matches
    heads_read = False
    for n in sorted(filenames):
        if not _is_agent(n):
            continue
        p = dir_prefix + n
        sid = _head_session_id(p)
        main = by_sid.get(sid) if sid else None
        if main is None and sid and not heads_read:  # (a name always wins: setdefault)
            heads_read = True
            for m in mains:
                head = _head_session_id(dir_prefix + m)
                if head:
                    by_sid.setdefault(head, dir_prefix + m)
            main = by_sid.get(sid)
        # parent session not here: keep the agent file as its own session
        if main is None:
            main = dir_prefix + f"{sid or n[: -len('.jsonl')]}.jsonl"
        out.append((main, p))
    return out


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
            # (a link is fingerprinted, not followed)
            st = p.stat(follow_symlinks=False)
            h.update(f"|{p}|{st.st_size}|{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"|{p}|missing".encode())
    return h.hexdigest()[:32]


def agent_stream_meta(rel: str, session_key: str) -> tuple[str, str, str]:
    """``(stream_id, kind, agent_id)`` of an agent file's stream (``rel``: its path under the trace root)."""
    name = rel.rsplit("/", 1)[-1]
    agent_id = name[len("agent-") : -len(".jsonl")] if name.startswith("agent-") else name
    kind = "subagents_dir" if "/subagents/" in f"/{rel}" else "sibling_agent_file"
    return f"{session_key}:agent-{agent_id}", kind, agent_id
