"""Issue 34: states with no user turn are never sent (§2), and cheap teachers first (§4: ``escalation``), through
the replay front end (prepare → plan → keys → replay) against the loopback provider emulator, whose scripted
teachers agree or disagree with the agent state by state; both ledgers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

from composer_pipeline.ingest.pipeline import ingest_paths
from composer_pipeline.ledger import open_ledger
from composer_pipeline.pairs.build import build_pairs, pair_ruled_out, voters_from_config
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.render import RenderOptions
from composer_pipeline.replay.front import ReplayFront, plan_summary
from composer_pipeline.replay.prepared import dump_run, load_run
from composer_pipeline.replay.run import ReplayRun
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from tests.support.provider_emulator import ModelRules, ProviderEmulator
from tests.support.sessions import Session, text, tool

PRICES = {"cheap-a": (0.25, 2.0), "cheap-b": (0.3, 2.5), "strong-a": (5.0, 25.0)}


@pytest.fixture
def emu():
    srv = ProviderEmulator({m: ModelRules("openai", 128_000, i, o, i / 10) for m, (i, o) in PRICES.items()}).start()
    yield srv
    srv.stop()


def teachers(url: str, escalation: list[list[str]] | None = None):
    entries = [
        dict(
            name=m,
            base_url=url,
            model=m,
            api_key_env=None,
            input_usd_per_mtok=i,
            output_usd_per_mtok=o,
            budget_usd=5.0,
            max_concurrency=2,
            max_tokens=64,
            temperature=0.0,
            timeout_s=10.0,
            max_retries=1,
            backoff_s=0.01,
            backoff_max_s=0.02,
        )
        for m, (i, o) in PRICES.items()
    ]
    return parse_teachers(
        {"ceiling_usd": 5.0, "teachers": entries, **({"escalation": escalation} if escalation else {})}, "test"
    )


def ingest(root: Path, sessions: list[Session]) -> tuple[pa.Table, pa.Table]:
    for n, s in enumerate(sessions):
        s.write(root / "-home-u-p" / f"5e5510e0-0000-4000-8000-{n:012d}.jsonl")
    res = list(ingest_paths([root]))
    return pa.concat_tables([r.states for r in res]), pa.concat_tables([r.messages for r in res])


def task_sessions(n: int) -> list[Session]:
    """One state per session: the user asks for task k, the agent reads /repo/f{k}.py."""
    out = []
    for k in range(n):
        s = Session(sid=f"5e5510e0-0000-4000-8000-{k:012d}")
        s.user(f"task {k}: look at the module")
        s.assistant(tool("Read", f"t{k}", file_path=f"/repo/f{k}.py"))
        out.append(s)
    return out


def scripted(disagree: dict[str, set[int]]):
    """The emulator's answers: teacher model m reads the agent's file at task k, except for k in disagree[m]."""

    def answer(body: dict) -> dict:
        k = int(re.search(r"task (\d+)", json.dumps(body["messages"])).group(1))
        if k in disagree.get(body["model"], set()):
            call = {"name": "Bash", "arguments": json.dumps({"command": "ls /repo"})}
        else:
            call = {"name": "Read", "arguments": json.dumps({"file_path": f"/repo/f{k}.py"})}
        return {"tool_calls": [{"id": f"call_{k}", "type": "function", "function": call}]}

    return answer


def replay(cfg, states, messages, tmp_path: Path, ledger_url: str, run_id: str):
    front = ReplayFront(cfg, ResponseCache(tmp_path / "cache"), open_ledger(ledger_url))  # packaged pairs recipe
    run = front.prepare(states, messages, RenderOptions())
    plan = front.plan(run)
    keys = front.keys(plan, {t.name: None for t in cfg.teachers})
    return plan, front.replay(run, plan, keys, run_id).result


def sent(emu: ProviderEmulator) -> list[tuple[str, int]]:
    return sorted(
        (r.body["model"], int(re.search(r"task (\d+)", json.dumps(r.body["messages"])).group(1))) for r in emu.requests
    )


# --- §2: no user turn ------------------------------------------------------------------------------------------
def test_states_without_a_user_turn_are_skipped_counted_and_never_paid(emu, tmp_path, ledger_url):
    s = Session()
    s.user("task 0: look at the module")
    s.assistant(tool("Read", "t1", file_path="/repo/f0.py"))
    s.result("t1", "x = 1")
    s.assistant(text("Done."))
    s.assistant(tool("Bash", "t2", command="ls"), parent=None)  # parent link null
    s.assistant(tool("Bash", "t3", command="pwd"), parent="00000000-dead-4000-8000-000000000000")  # dangling
    lone = json.loads(s.lines[-1])
    lone.pop("parentUuid")  # missing
    lone["uuid"], lone["message"]["id"] = "00000000-0000-4000-8000-00000000beef", "msg_lone"
    lone["requestId"] = "req_lone"
    lone["message"]["content"] = [tool("Bash", "t4", command="whoami")]
    s.obj(lone)
    states, messages = ingest(tmp_path / "p", [s])
    assert states.num_rows == 5
    emu.answer = scripted({})
    cfg = teachers(emu.url)

    plan, res = replay(cfg, states, messages, tmp_path, ledger_url, "r1")

    skips = [r for r in plan.table.to_pylist() if r["skip_reason"]]
    assert len(skips) == 3 * 3 and all(r["skip_reason"].startswith("no_user_turn: not sent") for r in skips)
    assert all(r["worst_case_usd"] == 0.0 and r["predicted_usd"] == 0.0 for r in skips)
    assert plan_summary(plan)["skipped_calls_by_teacher"] == {t: 3 for t in PRICES}
    # the two states with a user turn, once per teacher
    assert len(emu.requests) == 2 * 3
    rows = res.table.to_pylist()
    lone_rows = [r for r in rows if r["reason"] and r["reason"].startswith("no_user_turn")]
    assert len(lone_rows) == 9 and {r["status"] for r in lone_rows} == {"skipped"}
    assert all(r["paid_usd"] == 0.0 and r["attempts"] == 0 for r in lone_rows)
    assert res.summary["skipped"] == 9 and res.summary["skipped_by_reason"] == {"no_user_turn": 9}
    assert res.summary["failed"] == 0 and res.summary["answered"] == 6


# --- §4: cheap teachers first ----------------------------------------------------------------------------------
def test_escalation_sends_the_next_tier_only_while_a_pair_is_possible(emu, tmp_path, ledger_url):
    # task 0: both cheap teachers agree with the agent; 1: cheap-a differs; 2: both cheap differ alike
    states, messages = ingest(tmp_path / "p", task_sessions(3))
    emu.answer = scripted({"cheap-a": {1, 2}, "cheap-b": {2}, "strong-a": {1, 2}})
    cfg = teachers(emu.url, [["cheap-a", "cheap-b"], ["strong-a"]])

    plan, res = replay(cfg, states, messages, tmp_path, ledger_url, "r1")

    # the plan reserves every tier that might be called and says how much of it is conditional
    s = plan_summary(plan)
    assert s["calls_planned"] == 9 and s["conditional_calls"] == 3
    assert s["worst_case_by_teacher"]["strong-a"] > 0 and s["conditional_worst_case_usd"] == pytest.approx(
        s["worst_case_by_teacher"]["strong-a"]
    )
    assert sent(emu) == [("cheap-a", 0), ("cheap-a", 1), ("cheap-a", 2), ("cheap-b", 0), ("cheap-b", 1)] + [
        ("cheap-b", 2),
        ("strong-a", 1),
        ("strong-a", 2),
    ]
    rows = {(r["teacher"], r["state_id"]): r for r in res.table.to_pylist()}
    assert len(rows) == 9
    agent0 = states.filter(pa.compute.match_substring(states.column("action"), "/repo/f0.py")).column("state_id")[0]
    not_called = rows[("strong-a", agent0.as_py())]
    assert not_called["status"] == "skipped" and not_called["paid_usd"] == 0.0
    assert not_called["reason"].startswith("not_escalated: agrees_with_agent: not sent")
    assert "tier 1 (cheap-a, cheap-b)" in not_called["reason"]
    assert res.summary["skipped_by_reason"] == {"not_escalated": 1} and res.summary["answered"] == 8
    pairs = build_pairs(states, messages, res.table, PairRecipe.load(None), RenderOptions(), teachers=cfg)
    assert pairs.stats["pairs"] == 2 and pairs.stats["positives"] == 1
    assert pairs.stats["replays_skipped"] == 1 and pairs.stats["replays_not_answered"] == 0
    billed = emu.billed_usd()
    assert res.summary["spend_usd"] == pytest.approx(billed, rel=0.01)

    # a re-run with the same arguments decides alike from what is already paid: it sends nothing
    plan2, again = replay(cfg, states, messages, tmp_path, ledger_url, "r2")
    assert len(emu.requests) == 8 and emu.billed_usd() == billed
    assert again.summary["http_requests"] == 0 and again.summary["spend_usd"] == 0.0
    assert again.summary["skipped_by_reason"] == {"not_escalated": 1}
    # the one strong call never made may still be made
    assert plan_summary(plan2)["conditional_calls"] == 1


def test_without_escalation_every_teacher_is_asked(emu, tmp_path, ledger_url):
    states, messages = ingest(tmp_path / "p", task_sessions(3))
    emu.answer = scripted({"cheap-a": {1, 2}, "cheap-b": {2}, "strong-a": {1, 2}})
    plan, res = replay(teachers(emu.url), states, messages, tmp_path, ledger_url, "r1")
    assert plan.conditional_calls == 0 and len(emu.requests) == 9 and res.summary["skipped"] == 0


@pytest.mark.parametrize(
    ("escalation", "message"),
    [
        ([["cheap-a", "cheap-b"], ["strong-a", "cheap-a"]], r"\['cheap-a'\] appear more than once"),
        ([["cheap-a", "cheap-b"], ["strong-b"]], r"\['strong-b'\] are not teachers.*\['strong-a'\] are in no tier"),
        ([["cheap-a", "cheap-b", "strong-a"], []], "a tier is empty"),
    ],
)
def test_escalation_names_each_teacher_once(escalation, message):
    with pytest.raises(ValueError, match="test: escalation: " + message):
        teachers("http://127.0.0.1:9/v1", escalation)


def test_escalation_in_batch_mode_is_a_load_error_not_every_tier_at_once():
    """A batch answers every tier at once, so escalation would silently buy what it exists to avoid."""
    import dataclasses

    cfg = teachers("http://127.0.0.1:9/v1", [["cheap-a", "cheap-b"], ["strong-a"]])
    with pytest.raises(ValueError, match="escalation and mode: batch do not combine"):
        dataclasses.replace(cfg, mode="batch")


def test_pair_ruled_out_reads_the_pair_builders_agreement():
    agent = '{"text": "", "tool_calls": [{"id": "a", "name": "Read", "arguments": {"file_path": "/repo/f0.py"}}]}'
    same = '{"text": "", "tool_calls": [{"id": "x", "name": "Read", "arguments": {"file_path": "/repo/./f0.py"}}]}'
    other = '{"text": "", "tool_calls": [{"id": "y", "name": "Bash", "arguments": {"command": "ls"}}]}'
    cfg = teachers("http://127.0.0.1:9/v1")
    voters, recipe = voters_from_config(cfg), PairRecipe.load(None)

    def row(t: str, action: str, finish: str = "tool_calls") -> dict:
        return {"teacher": t, "status": "answered", "action": action, "call_id": t, "model": t, "finish_reason": finish}

    assert pair_ruled_out(agent, [], voters, recipe) is None  # nothing answered yet
    assert pair_ruled_out(agent, [row("cheap-a", same)], voters, recipe) is None  # one vote is no consensus
    both = [row("cheap-a", same), row("cheap-b", same)]
    assert pair_ruled_out(agent, both, voters, recipe) == "agrees_with_agent"
    assert pair_ruled_out(agent, [row("cheap-a", same), row("cheap-b", other)], voters, recipe) is None
    cut = [row("cheap-a", same), row("cheap-b", same, finish="length")]  # a cut answer never votes
    assert pair_ruled_out(agent, cut, voters, recipe) is None
    assert pair_ruled_out("not json", both, voters, recipe) == "agent_action_unreadable"


def test_a_prepared_run_keeps_the_agents_actions(emu, tmp_path):
    states, messages = ingest(tmp_path / "p", task_sessions(2))
    cfg = teachers(emu.url, [["cheap-a", "cheap-b"], ["strong-a"]])
    run = ReplayRun.prepare(states, messages, cfg, RenderOptions())
    back = load_run(dump_run(run), cfg)
    assert back.agents == run.agents and len(back.agents) == 2 and all(back.agents.values())
