"""Cheap teachers first (teachers recipe ``escalation``) against every teacher at once: dollars per kept pair and
the share of the same pairs kept (issue 34 §4), on the loopback provider emulator.

Two corpora, each replayed twice through the real front end (prepare → plan → keys → replay), client,
ledger and cache (fresh ones per mode), then paired by the real pair builder (``recipes/pairs.yaml``):

* ``emulator``: generated multi-turn Claude Code sessions (tests/support/long_sessions.py);
* ``real traces``: the real sessions under ``--traces`` (default /work/shared/traces), ingested as they are.
  Only the prompts are real: the teachers' answers are the emulator's scripted ones, not real models'.

Three teachers, all OpenAI-style on the emulator, at list-price-like rates ($/Mtok in / out):
``cheap-a`` 0.25 / 2 and ``cheap-b`` 0.30 / 2.50 (mini-class), ``strong-a`` 5 / 25 (frontier-class).
Escalation: ``[[cheap-a, cheap-b], [strong-a]]``; all at once: every teacher at every state.

Scripted answers (what the agreement rates assume), drawn per state from a seeded hash so both modes see
the same answers: the agent's action is the best decision with probability ``--agent-right`` (0.8), else the
best decision is another one (a ``Bash`` call); each teacher gives the best decision with probability
``--cheap-right`` (0.8) or ``--strong-right`` (0.9), else a wrong answer of its own (never shared).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_escalation.py [--sessions 8] [--turns 30] [--traces DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import orjson
import pyarrow as pa

from composer_pipeline.actions import Action
from composer_pipeline.ingest.pipeline import ingest_paths
from composer_pipeline.ledger import Ledger
from composer_pipeline.pairs.build import build_pairs
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.render import RenderOptions
from composer_pipeline.replay.front import ReplayFront, plan_summary
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers

# the test helpers (tests/support) live in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.long_sessions import write_long_sessions  # noqa: E402
from tests.support.provider_emulator import ModelRules, ProviderEmulator  # noqa: E402

PRICES = {"cheap-a": (0.25, 2.0), "cheap-b": (0.30, 2.5), "strong-a": (5.0, 25.0)}
TIERS = [["cheap-a", "cheap-b"], ["strong-a"]]


def config(url: str, escalation: bool):
    entries = [
        dict(
            name=m,
            base_url=url,
            model=m,
            api_key_env=None,
            input_usd_per_mtok=i,
            output_usd_per_mtok=o,
            cached_input_usd_per_mtok=i / 10,
            budget_usd=1000.0,
            max_concurrency=8,
            max_tokens=256,
            temperature=0.0,
            timeout_s=30.0,
            max_retries=1,
            backoff_s=0.01,
            backoff_max_s=0.02,
        )
        for m, (i, o) in PRICES.items()
    ]
    return parse_teachers(
        {"ceiling_usd": 1000.0, "teachers": entries, **({"escalation": TIERS} if escalation else {})}, "bench"
    )


def _draw(*parts: str) -> float:
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:8], "big") / 2**64


def _key(messages: list[dict]) -> bytes:
    """The state a prompt is (the OpenAI protocol sends no ``is_error``: the key leaves it out on both sides)."""
    bare = [{k: v for k, v in m.items() if k != "is_error"} for m in messages]
    return hashlib.sha256(orjson.dumps(bare, option=orjson.OPT_SORT_KEYS)).digest()


def _message(action: Action) -> dict:
    if action.tool_calls:
        calls = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()},
            }
            for i, c in enumerate(action.tool_calls)
        ]
        return {"tool_calls": calls}
    return {"content": action.text}


class Script:
    """The emulator's teachers (module docstring): the answer of a model to a state, by the state's prompt."""

    def __init__(self, by_prompt: dict[bytes, tuple[str, str]], args) -> None:
        # sha256 of the messages -> (state_id, agent action JSON)
        self.by_prompt, self.args = by_prompt, args
        # requests whose prompt is no state's (the emulator's default answer): should stay 0
        self.unknown = 0

    def __call__(self, body: dict) -> dict | None:
        hit = self.by_prompt.get(_key(body["messages"]))
        if hit is None:
            self.unknown += 1
            return None
        sid, agent_json = hit
        model = body["model"]
        agent = Action.from_json(agent_json)
        best = agent
        if _draw("agent", sid) >= self.args.agent_right:
            best = Action.from_json(
                orjson.dumps(
                    {"tool_calls": [{"id": "b", "name": "Bash", "arguments": {"command": f"git diff -- {sid[:6]}"}}]}
                ).decode()
            )
        right = self.args.strong_right if model == "strong-a" else self.args.cheap_right
        if _draw("teacher", model, sid) < right:
            return _message(best)
        wrong = {"tool_calls": [{"id": "w", "name": "Bash", "arguments": {"command": f"echo {model} {sid[:8]}"}}]}
        return _message(Action.from_json(orjson.dumps(wrong).decode()))


def measure(name: str, states: pa.Table, messages: pa.Table, args, tmp: Path) -> list[dict]:
    """Both modes on one corpus, each against a fresh emulator (its prompt cache starts empty), ledger and cache."""
    agents = dict(zip(states.column("state_id").to_pylist(), states.column("action").to_pylist()))
    out = []
    for mode, escalation in (("all at once", False), ("escalation", True)):
        emu = ProviderEmulator({m: ModelRules("openai", 1_000_000, i, o, i / 10) for m, (i, o) in PRICES.items()})
        emu.start()
        try:
            cfg = config(emu.url, escalation)
            work = tmp / name.replace(" ", "_") / mode.replace(" ", "_")
            front = ReplayFront(cfg, ResponseCache(work / "cache"), Ledger(str(work / "ledger.sqlite")))
            run = front.prepare(states, messages, RenderOptions())
            script = Script({_key(r.body["messages"]): (r.state_id, agents[r.state_id]) for r in run.requests}, args)
            emu.answer = script
            plan = front.plan(run)
            keys = front.keys(plan, {t.name: None for t in cfg.teachers})
            res = front.replay(run, plan, keys, f"bench-{mode}").result
            pairs = build_pairs(states, messages, res.table, PairRecipe.load(None), RenderOptions(), teachers=cfg).pairs
            s = plan_summary(plan)
            out.append(
                {
                    "corpus": name,
                    "mode": mode,
                    "states": states.num_rows,
                    "calls_sent": res.summary["http_requests"],
                    "conditional_calls": s["conditional_calls"],
                    "worst_case_usd": s["worst_case_usd_total"],
                    "spend_usd": res.summary["spend_usd"],
                    "billed_usd": emu.billed_usd(),
                    "pairs": pairs.num_rows,
                    "pair_ids": set(pairs.column("pair_id").to_pylist()),
                    "unscripted": script.unknown,
                }
            )
        finally:
            emu.stop()
    return out


def ingest(root: Path) -> tuple[pa.Table, pa.Table]:
    res = list(ingest_paths([root]))
    return pa.concat_tables([r.states for r in res]), pa.concat_tables([r.messages for r in res])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--traces", default="/work/shared/traces")
    ap.add_argument("--agent-right", type=float, default=0.8)
    ap.add_argument("--cheap-right", type=float, default=0.8)
    ap.add_argument("--strong-right", type=float, default=0.9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        write_long_sessions(tmp / "gen", n_sessions=args.sessions, turns=args.turns, seed=7)
        rows = measure("emulator", *ingest(tmp / "gen"), args, tmp)
        if Path(args.traces).is_dir():
            rows += measure("real traces", *ingest(Path(args.traces)), args, tmp)
    print(
        f"{'corpus':<12} {'mode':<12} {'states':>6} {'sent':>5} {'cond.':>5} {'worst $':>9} {'spent $':>9} "
        f"{'billed $':>9} {'pairs':>5} {'$/pair':>9} {'cheaper':>7} {'same pairs':>10}"
    )
    for r in rows:
        base = next(b for b in rows if b["corpus"] == r["corpus"] and b["mode"] == "all at once")
        per = r["spend_usd"] / r["pairs"] if r["pairs"] else float("nan")
        base_per = base["spend_usd"] / base["pairs"] if base["pairs"] else float("nan")
        same = len(r["pair_ids"] & base["pair_ids"]) / len(base["pair_ids"]) if base["pair_ids"] else float("nan")
        print(
            f"{r['corpus']:<12} {r['mode']:<12} {r['states']:>6} {r['calls_sent']:>5} {r['conditional_calls']:>5} "
            f"{r['worst_case_usd']:>9.4f} {r['spend_usd']:>9.4f} {r['billed_usd']:>9.4f} {r['pairs']:>5} "
            f"{per:>9.5f} {base_per / per:>6.2f}x {same:>10.1%}"
            + (f"  UNSCRIPTED {r['unscripted']}" if r["unscripted"] else "")
        )
    print(
        f"(scripted answers: agent right {args.agent_right:.0%}, cheap teachers right {args.cheap_right:.0%}, "
        f"strong teacher right {args.strong_right:.0%}; wrong answers never shared)"
    )


if __name__ == "__main__":
    main()
