"""Generated Claude Code sessions for the read-before-edit experiment, in the real JSONL format.

In:  a directory, a session count, a split (``train`` / ``heldout``) and a seed.
Out: ``<dir>/-home-dev-app/<session uuid>.jsonl`` files that ``composer-pipeline ingest`` reads
     like any other Claude Code project: user requests, ``tool_use`` / ``tool_result`` records with
     ``toolUseResult``, parent links, timestamps.

Each session: a user asks to change one value in one file. Half of the agents call ``Edit`` first and
get Claude Code's real error (``File has not been read yet. Read it first before writing to it.``),
then ``Read`` and ``Edit`` again; the other half read first. Independently, half of the agents read
the file a second time before editing it: a wasted step where the teachers edit. So the agents err
both ways (too early an edit, too many reads), the pairs say both "Read, not Edit" and "Edit, not
Read", and "always Read" is as wrong as "always Edit". Before the request some sessions hold
history: an ``ls`` of the directory, or a ``Read`` of a *different* file (so "some file was read"
does not mean "the target was read"). A quarter of the agents also take a *detour* after the request:
they read another file of the directory first, so a state whose last turn is a successful ``Read``
can still have its target unread (a policy deciding from the last message alone fails there).
Every session runs in ``/home/dev/app``. A held-out session edits a (directory, file name) pair no
train session touches, not even as a decoy read (history or detour), with request wording of its
own, so its path must be copied from the request; the pieces (directories, names, extensions, keys,
values) are shared by both splits (see ``_HELDOUT_PAIRS``). The experiment draws held-out sessions
from :data:`HELDOUT_SEED` on, a seed range no design round looked at. A third split, ``pretrain``,
is the tiny base model's corpus: every pair, train wording only (no held-out request)."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict

NOT_READ = "File has not been read yet. Read it first before writing to it."

# Path pieces are shared by both splits; the (directory, file name) pairs are not: a held-out state
# names a file no train session touches, so writing its path means copying it from the request, not
# recalling it. The pieces themselves are shared because a policy trained from scratch on these
# sessions (the experiment's tiny model) has no embedding for a word it never saw; a pretrained model
# would. Request wording is disjoint outright (the policy reads it, never writes it).
_DIRS = ["src/api", "src/core", "lib/net", "app/models", "pkg/cache", "tools/cli"]
_NAMES = ["server", "client", "config", "router", "store", "worker", "parser", "session", "queue", "auth"]
_HELDOUT_PAIRS = {(d, n) for i, d in enumerate(_DIRS) for j, n in enumerate(_NAMES) if (i + j) % 4 == 0}


class _Split(TypedDict):
    files: list[tuple[str, str]]  # (directory, name) of each target file
    asks: list[str]  # the request's wordings


_SPLITS: dict[str, _Split] = {
    "train": {
        "files": [(d, n) for d in _DIRS for n in _NAMES if (d, n) not in _HELDOUT_PAIRS],
        "asks": [
            "Change {key} from {old} to {new} in {path}",
            "Please set {key} to {new} in {path} (it is {old} now)",
            "In {path}, update {key} = {old} to {new}",
        ],
    },
    "heldout": {
        "files": sorted(_HELDOUT_PAIRS),
        "asks": [
            "{path}: {key} should be {new} instead of {old}",
            "Could you bump {key} in {path} from {old} to {new}?",
        ],
    },
    # The tiny base model's corpus (experiments.pretrain): every (directory, name) pair, held-out ones
    # included, as a real pretrained model's corpus mentions files it will later be asked about; with
    # train wording only, so a held-out *state* (its request) is still never seen. Without this, the
    # held-out names only ever follow other directories and a from-scratch model writes the name it
    # saw after this directory instead of copying the requested one (bench/RESULTS.md).
    "pretrain": {
        "files": [(d, n) for d in _DIRS for n in _NAMES],
        "asks": [
            "Change {key} from {old} to {new} in {path}",
            "Please set {key} to {new} in {path} (it is {old} now)",
            "In {path}, update {key} = {old} to {new}",
        ],
    },
}
# every session runs in /home/dev/app: the file inside it is what varies
PROJECT = "app"
# each component of the repository is written in one language, as in a real monorepo: the extension
# follows the directory. (With extensions drawn per session the tiny base model learned a prior for
# `.go` instead of copying the requested one, which capped every strict metric: bench/RESULTS.md.)
_EXT_OF_DIR = {
    "src/api": "py",
    "src/core": "py",
    "lib/net": "go",
    "app/models": "ts",
    "pkg/cache": "go",
    "tools/cli": "rs",
}
_KEYS = ["TIMEOUT", "RETRIES", "PORT", "BATCH", "LIMIT", "WORKERS", "DEPTH"]


@dataclass(frozen=True)
class SessionPlan:
    """What one generated session does (kept for the experiment's own bookkeeping)."""

    session_id: str
    project: str
    path: str
    old: str
    new: str
    edit_first: bool
    # read the target a second time before editing it (a wasted step; teachers edit there)
    reread: bool
    history: str  # none | ls | decoy_read
    # another file read right after the request, before the target (None: no detour)
    detour: str | None = None


class _Writer:
    def __init__(self, session_id: str, cwd: str, t0: datetime):
        self.session_id, self.cwd, self.t = session_id, cwd, t0
        self.parent: str | None = None
        self.lines: list[str] = []
        self.n = 0

    def _emit(self, rec: dict) -> None:
        self.t += timedelta(seconds=7)
        u = str(uuid.UUID(int=random.Random(f"{self.session_id}{self.n}").getrandbits(128)))
        self.n += 1
        base = {
            "parentUuid": self.parent,
            "isSidechain": False,
            "userType": "external",
            "cwd": self.cwd,
            "sessionId": self.session_id,
            "version": "2.1.9",
            "gitBranch": "main",
        }
        self.lines.append(
            json.dumps({**base, **rec, "uuid": u, "timestamp": self.t.strftime("%Y-%m-%dT%H:%M:%S.000Z")})
        )
        self.parent = u

    def user(self, text: str) -> None:
        self._emit({"type": "user", "message": {"role": "user", "content": text}})

    def tool(self, name: str, inp: dict, result: str, tool_result: object, *, error: bool = False) -> None:
        tid = f"toolu_{self.session_id[:8]}{self.n:03d}"
        self._emit(
            {
                "type": "assistant",
                "requestId": f"req_{self.session_id[:8]}{self.n:03d}",
                "message": {
                    "model": "claude-sonnet-4-5-20250929",
                    "id": f"msg_{self.session_id[:8]}{self.n:03d}",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": tid, "name": name, "input": inp}],
                    "stop_reason": "tool_use",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 20},
                },
            }
        )
        block: dict[str, Any] = {"tool_use_id": tid, "type": "tool_result", "content": result}
        if error:
            block["is_error"] = True
        self._emit({"type": "user", "message": {"role": "user", "content": [block]}, "toolUseResult": tool_result})

    def say(self, text: str) -> None:
        self._emit(
            {
                "type": "assistant",
                "requestId": f"req_{self.session_id[:8]}{self.n:03d}",
                "message": {
                    "model": "claude-sonnet-4-5-20250929",
                    "id": f"msg_{self.session_id[:8]}{self.n:03d}",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 8},
                },
            }
        )


def _file_body(key: str, value: str, rng: random.Random) -> str:
    other = rng.choice(["DEBUG = False", 'NAME = "svc"', "VERSION = 2"])
    return f"{other}\n{key} = {value}\n"


def _read(w: _Writer, path: str, body: str) -> None:
    numbered = "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(body.splitlines(), 1))
    w.tool(
        "Read",
        {"file_path": path},
        numbered,
        {
            "type": "text",
            "file": {
                "filePath": path,
                "content": body,
                "numLines": body.count("\n"),
                "startLine": 1,
                "totalLines": body.count("\n"),
            },
        },
    )


def _edit(w: _Writer, path: str, old: str, new: str, *, ok: bool) -> None:
    inp = {"file_path": path, "old_string": old, "new_string": new}
    if ok:
        w.tool(
            "Edit", inp, f"The file {path} has been updated.", {"filePath": path, "oldString": old, "newString": new}
        )
    else:
        w.tool("Edit", inp, f"<tool_use_error>{NOT_READ}</tool_use_error>", f"Error: {NOT_READ}", error=True)


# held-out sessions are drawn from this seed on: no design round (runs 1-3 in bench/RESULTS.md used
# seed 0) has looked at them
HELDOUT_SEED = 100


def _decoy_names(split: str, d: str, name: str) -> list[str]:
    """Names a decoy read of a ``split`` session may take in directory ``d``: never the target and, in
    the ``train`` split, never a held-out file (a train session reading one would leak it)."""
    return [x for x in _NAMES if x != name and (split != "train" or (d, x) not in _HELDOUT_PAIRS)]


def write_sessions(
    root: str | Path,
    n: int,
    split: str,
    seed: int,
    edit_first_share: float = 0.5,
    reread_share: float = 0.5,
    detour_share: float = 0.25,
) -> list[SessionPlan]:
    """Write ``n`` sessions of ``split`` (``train`` / ``heldout`` / ``pretrain``) under ``root``; returns their plans."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
    pool = _SPLITS[split]
    rng = random.Random(f"{split}|{seed}")
    root = Path(root)
    plans = []
    for i in range(n):
        project = PROJECT
        cwd = f"/home/dev/{project}"
        sid = str(uuid.UUID(int=rng.getrandbits(128)))
        d, name = rng.choice(pool["files"])
        ext = _EXT_OF_DIR[d]
        path = f"{cwd}/{d}/{name}.{ext}"
        key = rng.choice(_KEYS)
        a, b = rng.sample(range(2, 99), 2)
        old, new = f"{key} = {a}", f"{key} = {b}"
        edit_first = rng.random() < edit_first_share
        reread = rng.random() < reread_share
        history = rng.choice(["none", "ls", "decoy_read"])
        detour = f"{cwd}/{d}/{rng.choice(_decoy_names(split, d, name))}.{ext}" if rng.random() < detour_share else None
        w = _Writer(sid, cwd, datetime(2026, 3, 1, 9, 0, tzinfo=UTC) + timedelta(minutes=i))
        if history != "none":
            w.user(rng.choice(["Have a look around first.", "What is in this directory?", "Show me the code layout."]))
            if history == "ls":
                w.tool(
                    "Bash",
                    {"command": f"ls {d}"},
                    f"{name}.{ext}\n__init__.{ext}",
                    {"stdout": f"{name}.{ext}", "stderr": ""},
                )
            else:
                decoy = f"{cwd}/{d}/{rng.choice(_decoy_names(split, d, name))}.{ext}"
                _read(w, decoy, _file_body(rng.choice(_KEYS), str(rng.randint(2, 99)), rng))
            w.say("Looked around.")
        w.user(rng.choice(pool["asks"]).format(key=key, old=a, new=b, path=path))
        if detour is not None:
            _read(w, detour, _file_body(rng.choice(_KEYS), str(rng.randint(2, 99)), rng))
        if edit_first:
            _edit(w, path, old, new, ok=False)
        body = _file_body(key, str(a), rng)
        _read(w, path, body)
        if reread:
            _read(w, path, body)
        _edit(w, path, old, new, ok=True)
        w.say(f"Done: {key} is {b} in {path}.")
        out = root / f"-home-dev-{project}" / f"{sid}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(w.lines) + "\n")
        plans.append(SessionPlan(sid, project, path, old, new, edit_first, reread, history, detour))
    return plans


def ingest_sessions(src: Path, store_root: Path) -> dict[str, int]:
    """Ingest the generated sessions under ``src`` through the normal ingest into a store at ``store_root``;
    rows per table."""
    import pyarrow as pa

    from composer_pipeline.ingest.pipeline import ingest_paths
    from composer_pipeline.store import Store

    parts: dict[str, list] = {"trace_states": [], "trace_messages": [], "quarantine": []}
    for res in ingest_paths([src]):
        parts["trace_states"].append(res.states)
        parts["trace_messages"].append(res.messages)
        parts["quarantine"].append(res.quarantine)
    store = Store(str(store_root))
    counts = {}
    for name, ts in parts.items():
        if not ts:
            raise ValueError(f"no sessions found under {src}")
        t = pa.concat_tables(ts)
        store.write_table(name, t)
        counts[name] = t.num_rows
    return counts
