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
        # still JSON (or nothing left): not a damaged line
        return None
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
        cut = rng.randint(value.index('"', len('"parentUuid"')) + 1, len(value) - 2)
        # a stray quote: not JSON, the value unreadable
        garbled = value[:cut] + '[REDACTED]"' + value[cut:]
        return line[: p.start()] + garbled + line[p.end() :]
    if mode == "missing_parent":
        return (line[: p.start()] + line[p.end() :].lstrip(",")).rstrip("}")
    if mode == "garbled_body":
        mid = rng.randint(min(p.end(), u), max(p.end(), u))
        return line[:mid] + '"' + line[mid:]
    raise ValueError(mode)


@dataclass
class Variant:
    damaged: Path
    repaired: Path
    # rel file -> damaged line numbers (1-based)
    lines: dict[str, set[int]] = field(default_factory=dict)
    # tool_use_ids whose result line was damaged
    results: set[str] = field(default_factory=set)


def make_variant(
    src: Path,
    out: Path,
    rng: random.Random,
    runs_per_40: float = 1.0,
    chain: tuple[int, ...] = (1, 2, 3),
    modes: tuple[str, ...] = MODES,
) -> Variant:
    """Write ``out/damaged`` and ``out/repaired`` from the sessions under ``src``: in each file about
    ``runs_per_40`` runs per 40 lines, each of a length drawn from ``chain``, each line a random mode."""
    picks: dict[str, dict[int, str]] = {}
    for f in sorted(src.rglob("*.jsonl")):
        lines = f.read_text().splitlines()
        ok = [i for i, line in enumerate(lines) if i > 0 and _record_uuid(line)]
        chosen: dict[int, str] = {}
        for _ in range(max(1, round(len(lines) * runs_per_40 / 40)) if ok else 0):
            start, k = rng.choice(ok), rng.choice(chain)
            run = [i for i in range(start, start + k) if i in ok]
            if not any(j in chosen or j - 1 in chosen or j + 1 in chosen for j in run):
                chosen.update((i, rng.choice(modes)) for i in run)  # runs stay apart (2 never become 4)
        picks[str(f.relative_to(src))] = chosen
    return damage_files(src, out, picks, rng)


def _record_uuid(line: str) -> str | None:
    try:
        o = json.loads(line)
    except json.JSONDecodeError:
        return None
    return o.get("uuid") if isinstance(o, dict) else None


def damage_files(src: Path, out: Path, picks: dict[str, dict[int, str]], rng: random.Random) -> Variant:
    """Write ``out/damaged`` (``picks``: rel file -> {0-based line index: mode}) and its repaired twin."""
    v = Variant(out / "damaged", out / "repaired")
    for d in (v.damaged, v.repaired):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.md"))
    for rel, chosen in picks.items():
        lines = (src / rel).read_text().splitlines()
        damaged = list(lines)
        done = set()
        for i, mode in chosen.items():
            t = damage_line(lines[i], mode, rng)
            if t is not None:
                damaged[i] = t
                done.add(i)
        if not done:
            continue
        v.lines[rel] = {i + 1 for i in done}
        objs = {i: json.loads(lines[i]) for i in done}
        # the repaired twin: damaged lines become record-less lines, children re-attached past them
        parent_of = {o["uuid"]: o.get("parentUuid") for o in objs.values()}
        repaired = []
        for i, line in enumerate(lines):
            if i in done:
                repaired.append(PLACEHOLDER)
                m = objs[i].get("message")
                c = m.get("content") if isinstance(m, dict) else None
                for b in c if isinstance(c, list) else []:
                    if isinstance(b, dict) and b.get("type") == "tool_result":
                        v.results.add(str(b.get("tool_use_id")))
                continue
            if '"parentUuid"' in line:
                try:
                    o = json.loads(line)
                except json.JSONDecodeError:
                    o = None
                if isinstance(o, dict) and o.get("parentUuid") in parent_of:
                    p, seen = o["parentUuid"], set()
                    while p in parent_of and p not in seen:
                        seen.add(p)
                        p = parent_of[p]
                    line = json.dumps(dict(o, parentUuid=p), ensure_ascii=False)
            repaired.append(line)
        (v.damaged / rel).write_text("".join(x + "\n" for x in damaged))
        (v.repaired / rel).write_text("".join(x + "\n" for x in repaired))
    return v


def _ingest(engine: str):
    return lambda sf: ingest_session(sf, None, engine=engine)


def prefixes(root: Path, ingest) -> dict[tuple, list[dict]]:
    """(file, source lines) -> rendered prefix of each state (not keyed by state id: a damaged
    sidechain root changes the stream id of the repaired twin, whose sidechain starts one record later)."""
    out = {}
    for sf in discover_sessions(root):
        res = ingest(sf)
        conv = Conversation.from_table(res.messages)
        for st in res.states.to_pylist():
            out[(st["source_file"], tuple(st["source_lines"]))] = render_state(conv, st, RenderOptions()).messages
    return out


def masked(prefix: list[dict], results: set[str]) -> list[dict]:
    return [
        dict(m, content="<damaged result>")
        if m.get("role") == "tool"
        and m.get("tool_call_id") in results
        and (m["content"] == INTERRUPTED or m["content"].startswith("[salvaged"))
        else m
        for m in prefix
    ]


@dataclass
class Score:
    states: int = 0
    right: int = 0
    # states whose prefix holds the repaired prefix's assistant messages
    assistants_right: int = 0
    missing: int = 0

    def add(self, other: Score) -> None:
        for k in ("states", "right", "assistants_right", "missing"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def __str__(self) -> str:
        pct = 100 * self.right / max(self.states, 1)
        pa = 100 * self.assistants_right / max(self.states, 1)
        return (
            f"{self.right}/{self.states} states with the right prefix ({pct:.1f} %); "
            f"assistant messages right in {pa:.1f} %; {self.missing} states missing"
        )


def score(v: Variant, ingest=None) -> Score:
    ingest = ingest or _ingest("python")
    want, got = prefixes(v.repaired, ingest), prefixes(v.damaged, ingest)
    s = Score()
    for sid, prefix in want.items():
        s.states += 1
        mine = got.get(sid)
        if mine is None:
            s.missing += 1
            continue
        s.right += masked(mine, v.results) == masked(prefix, v.results)
        s.assistants_right += [m for m in mine if m["role"] == "assistant"] == [
            m for m in prefix if m["role"] == "assistant"
        ]
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
            total.add(score(v, _ingest(a.engine)))
    print(f"chains {a.chain}, {a.seeds} variants: {total}")


if __name__ == "__main__":
    main(sys.argv[1:])
