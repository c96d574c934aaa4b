"""Damage real sessions the way crashes and redaction do, and score the prefixes ingest keeps.

Used by tests/ingest/test_damaged_real.py and runnable on its own to print the score of the code on
``PYTHONPATH`` (so the code before a change can be scored the same way)::

    PYTHONPATH=$PWD .venv/bin/python tests/ingest/damage.py /work/shared/traces --seeds 20

A *variant* of a trace root damages, in every session file, a few runs of 1, 2 or 3 records in a row
(records with a uuid, not a file's first line), each line by one of :data:`MODES`:

* ``cut_early``: cut before or inside its ``parentUuid`` (uuid and parent both lost);
* ``cut_late``: cut after ``parentUuid``, before ``uuid`` (parent readable, uuid lost);
* ``garbled_parent``: the parent's value garbled by redaction, line no longer JSON (uuid readable);
* ``missing_parent``: ``parentUuid`` key gone and the line cut at its end (uuid readable);
* ``garbled_body``: a stray quote in the middle (both ids readable).

"Right prefix": the damaged session's rendered prefix of a state equals that of the *repaired*
session: the intact session with each damaged line replaced by a record-less line (line numbers
kept) and its children re-attached to its nearest undamaged ancestor (what a perfect bridge would
give: the damaged lines' own messages are gone, everything else is kept). A tool message answering a
call whose result line was damaged may read ``[interrupted: no result]`` or a salvaged result in
either (both are right: salvage is scored by its own test). A state the repaired session has and the
damaged one lacks counts as wrong.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.ingest.pipeline import ingest_session
from composer_pipeline.render import INTERRUPTED, Conversation, RenderOptions, render_state

MODES = ("cut_early", "cut_late", "garbled_parent", "missing_parent", "garbled_body")
_PARENT_VALUE = re.compile(r'"parentUuid"\s*:\s*"[0-9a-fA-F-]+"')
PLACEHOLDER = '{"type":"file-history-snapshot","messageId":"damaged","snapshot":{},"isSnapshotUpdate":false}'


def damage_line(line: str, mode: str, rng: random.Random) -> str | None:
    """The damaged text of one record line (``None`` when the mode does not apply to it)."""
    out = _damage(line, mode, rng)
    try:
        json.loads(out or "")
        return None  # still JSON (or nothing left): not a damaged line
    except json.JSONDecodeError:
        return out


def _damage(line: str, mode: str, rng: random.Random) -> str | None:
    u = line.find('"uuid"')
    p = _PARENT_VALUE.search(line)
    if u < 0 or p is None:
        return None
    if mode == "cut_early":
        return line[: rng.randint(1, p.end() - 2)] if p.end() < u else None
    if mode == "cut_late":
        return line[: rng.randint(p.end() + 1, u)] if p.end() < u else None
    if mode == "garbled_parent":
        value = p.group(0)
        cut = rng.randint(len('"parentUuid":"') + 1, len(value) - 2)
        garbled = value[:cut] + '[REDACTED_' + value[cut:]  # the value's quote is gone: not JSON
        return line[: p.start()] + garbled + line[p.end():]
    if mode == "missing_parent":
        return (line[: p.start()] + line[p.end():].lstrip(",")).rstrip("}")
    if mode == "garbled_body":
        mid = rng.randint(min(p.end(), u), max(p.end(), u))
        return line[:mid] + '"' + line[mid:]
    raise ValueError(mode)


@dataclass
class Variant:
    damaged: Path
    repaired: Path
    lines: dict[str, set[int]] = field(default_factory=dict)  # rel file -> damaged line numbers (1-based)
    results: set[str] = field(default_factory=set)  # tool_use_ids whose result line was damaged


def make_variant(src: Path, out: Path, rng: random.Random, runs_per_40: float = 1.0,
                 chain: tuple[int, ...] = (1, 2, 3), modes: tuple[str, ...] = MODES) -> Variant:
    """Write ``out/damaged`` and ``out/repaired`` from the sessions under ``src``."""
    v = Variant(out / "damaged", out / "repaired")
    for d in (v.damaged, v.repaired):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.md"))
    for f in sorted(src.rglob("*.jsonl")):
        rel = str(f.relative_to(src))
        lines = f.read_text().splitlines()
        objs = []
        for line in lines:
            try:
                objs.append(json.loads(line))
            except json.JSONDecodeError:
                objs.append(None)
        ok = [i for i, o in enumerate(objs) if i > 0 and isinstance(o, dict) and o.get("uuid")]
        n_runs = max(1, round(len(lines) * runs_per_40 / 40)) if ok else 0
        chosen: set[int] = set()
        for _ in range(n_runs):
            k = rng.choice(chain)
            start = rng.choice(ok)
            run = [i for i in range(start, start + k) if i in ok]
            if any(j in chosen or j - 1 in chosen or j + 1 in chosen for j in run):
                continue  # runs stay apart (a run of 2 never silently becomes one of 4)
            texts = [damage_line(lines[i], rng.choice(modes), rng) for i in run]
            if None in texts:
                continue
            for i, t in zip(run, texts):
                lines[i] = t
                chosen.add(i)
        if not chosen:
            continue
        v.lines[rel] = {i + 1 for i in chosen}
        # the repaired twin: damaged lines become record-less lines, children re-attached past them
        parent_of = {objs[i]["uuid"]: objs[i].get("parentUuid") for i in chosen}
        repaired = []
        for i, line in enumerate(f.read_text().splitlines()):
            o = objs[i]
            if i in chosen:
                repaired.append(PLACEHOLDER)
                c = o.get("message", {}).get("content") if isinstance(o.get("message"), dict) else None
                for b in c if isinstance(c, list) else []:
                    if isinstance(b, dict) and b.get("type") == "tool_result":
                        v.results.add(str(b.get("tool_use_id")))
                continue
            if isinstance(o, dict) and o.get("parentUuid") in parent_of:
                p = o["parentUuid"]
                seen = set()
                while p in parent_of and p not in seen:
                    seen.add(p)
                    p = parent_of[p]
                o = dict(o, parentUuid=p)
                line = json.dumps(o, ensure_ascii=False)
            repaired.append(line)
        (v.damaged / rel).write_text("".join(x + "\n" for x in lines))
        (v.repaired / rel).write_text("".join(x + "\n" for x in repaired))
    return v


def _prefixes(root: Path, engine: str) -> dict[tuple, list[dict]]:
    """(file, source lines) -> rendered prefix of each state (not keyed by state id: a damaged
    sidechain root changes the stream id of the repaired twin, whose sidechain starts one record later)."""
    out = {}
    for sf in discover_sessions(root):
        res = ingest_session(sf, None, engine=engine)
        conv = Conversation.from_table(res.messages)
        for st in res.states.to_pylist():
            out[(st["source_file"], tuple(st["source_lines"]))] = render_state(conv, st, RenderOptions()).messages
    return out


def _masked(prefix: list[dict], results: set[str]) -> list[dict]:
    return [dict(m, content="<damaged result>") if m.get("role") == "tool" and m.get("tool_call_id") in results
            and (m["content"] == INTERRUPTED or m["content"].startswith("[salvaged")) else m for m in prefix]


@dataclass
class Score:
    states: int = 0
    right: int = 0
    assistants_right: int = 0  # states whose prefix holds the repaired prefix's assistant messages
    missing: int = 0

    def add(self, other: "Score") -> None:
        for k in ("states", "right", "assistants_right", "missing"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def __str__(self) -> str:
        pct = 100 * self.right / max(self.states, 1)
        pa = 100 * self.assistants_right / max(self.states, 1)
        return (f"{self.right}/{self.states} states with the right prefix ({pct:.1f} %); "
                f"assistant messages right in {pa:.1f} %; {self.missing} states missing")


def score(v: Variant, engine: str = "python") -> Score:
    want, got = _prefixes(v.repaired, engine), _prefixes(v.damaged, engine)
    s = Score()
    for sid, prefix in want.items():
        s.states += 1
        mine = got.get(sid)
        if mine is None:
            s.missing += 1
            continue
        s.right += _masked(mine, v.results) == _masked(prefix, v.results)
        s.assistants_right += [m for m in mine if m["role"] == "assistant"] == [
            m for m in prefix if m["role"] == "assistant"]
    return s


def main(argv: list[str]) -> None:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--chain", default="1,2,3", help="run lengths to draw from")
    ap.add_argument("--engine", default="python")
    a = ap.parse_args(argv)
    chain = tuple(int(x) for x in a.chain.split(","))
    total = Score()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            v = make_variant(a.root, Path(tmp) / str(seed), random.Random(seed), chain=chain)
            total.add(score(v, a.engine))
    print(f"chains {a.chain}, {a.seeds} variants: {total}")


if __name__ == "__main__":
    main(sys.argv[1:])
