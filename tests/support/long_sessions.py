"""Long multi-turn Claude Code sessions for the caching and window tests and ``bench/bench_caching.py``.

In:  a root directory, how many sessions, turns per session and a seed.
Out: ``<root>/<project>/<session>.jsonl`` files in Claude Code's record shapes (built with
     :class:`~tests.support.sessions.Session`): a task, then per turn one assistant response
     (a line of text + one ``Read``/``Bash``/``Grep``/``Edit`` call) and its tool result. Tool-result sizes
     are drawn log-normally (median ≈ 1.6 k characters, a few tens of kB at the tail) so that prefixes grow
     the way real ones do (the 31 real sessions measured in /work/shared/notes/providers.md: p50 ≈ 96 k
     characters, max ≈ 482 k).

Deliberately simplified: one main stream per session (no subagents), our own filler text.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

from .sessions import Session, text, tool

_WORDS = (
    "def class return import self value config parser render token window cache stream state teacher ledger "
    "budget reserve settle answer request prefix session agent tool result error retry assert test fixture"
).split()


def _filler(rng: random.Random, n_chars: int) -> str:
    lines, size = [], 0
    while size < n_chars:
        line = f"{rng.randint(1, 999):4d}  " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:n_chars]


def write_long_sessions(
    root: str | Path,
    n_sessions: int = 6,
    turns: int = 60,
    seed: int = 0,
    median_result_chars: int = 1600,
    project: str = "longproj",
) -> list[Path]:
    """Write ``n_sessions`` sessions of ``turns`` agent steps each (turn counts vary ±50% per session)."""
    rng = random.Random(seed)
    root = Path(root)
    counter = itertools.count(1)
    files = []
    for k in range(n_sessions):
        sid = f"{seed:08x}-{k:04x}-4000-8000-{k:012x}"

        def new() -> str:
            return f"{seed:08x}-0000-4000-8000-{next(counter):012x}"

        s = Session(sid=sid, new_uuid=new, cwd=f"/home/u/{project}")
        s.user(
            f"Session {k}: fix the failing tests in the parser module and keep the public API unchanged. "
            + _filler(rng, 400)
        )
        n = max(2, int(turns * rng.uniform(0.5, 1.5)))
        for t in range(n):
            tid = f"toolu_{seed:04x}{k:04x}{t:06x}"
            kind = rng.choice(("Read", "Read", "Bash", "Grep", "Edit"))
            args = {
                "Read": {"file_path": f"/home/u/{project}/src/mod_{rng.randint(0, 40)}.py"},
                "Bash": {"command": f"pytest -q tests/test_{rng.randint(0, 20)}.py"},
                "Grep": {"pattern": rng.choice(_WORDS), "path": "src"},
                "Edit": {
                    "file_path": f"/home/u/{project}/src/mod_{rng.randint(0, 40)}.py",
                    "old_string": rng.choice(_WORDS),
                    "new_string": rng.choice(_WORDS),
                },
            }[kind]
            s.assistant(
                text(f"Step {t}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 25)))),
                tool(kind, tid, **args),
                mid=f"msg_{sid[:8]}_{k}_{t:04d}",
            )
            size = int(min(60_000, math.exp(rng.gauss(math.log(median_result_chars), 1.0))))
            s.result(tid, _filler(rng, size))
        files.append(s.write(root / project / f"{sid}.jsonl"))
    return files


def write_edit_session(
    root: str | Path, n_edits: int, file_chars: int = 200_000, snippet_chars: int = 2_000, seed: int = 0
) -> Path:
    """One session that reads a large file (``file_chars``) and then edits it ``n_edits`` times, each
    ``Edit`` answered with a snippet of ``snippet_chars`` (the shape of issue 30's 700-Edit session): every
    state's prefix holds the file and all earlier edits, so a preparation that redoes the whole prefix per
    state grows with the square of ``n_edits`` (``bench/bench_prepare.py``, ``tests/replay/test_prepare_scaling.py``)."""
    rng = random.Random(seed)
    counter = itertools.count(1)
    sid = f"{seed:08x}-edit-4000-8000-{n_edits:012x}"

    def new() -> str:
        return f"{seed:08x}-0000-4000-8000-{next(counter):012x}"

    s = Session(sid=sid, new_uuid=new, cwd="/home/u/editproj")
    s.user("Rename every `value` to `amount` in src/big.py, one occurrence at a time.")
    s.assistant(
        text("Reading the file."), tool("Read", "toolu_read", file_path="/home/u/editproj/src/big.py"), mid="msg_read"
    )
    s.result("toolu_read", _filler(rng, file_chars))
    for t in range(n_edits):
        tid = f"toolu_edit_{t:06d}"
        s.assistant(
            text(f"Edit {t}."),
            tool(
                "Edit", tid, file_path="/home/u/editproj/src/big.py", old_string=f"value_{t}", new_string=f"amount_{t}"
            ),
            mid=f"msg_edit_{t:06d}",
        )
        s.result(tid, "The file src/big.py has been updated. Snippet:\n" + _filler(rng, snippet_chars))
    return s.write(Path(root) / "editproj" / f"{sid}.jsonl")
