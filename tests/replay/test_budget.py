"""Budgets under full concurrency: reservations never let spend pass a teacher budget or a run
ceiling, inside one process (asyncio tasks) or across processes sharing one ledger file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from ledger_helpers import spend_by_run

from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.plan import plan_requests
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, scripted_request


def test_budget_race_in_one_process(tmp_path, server):
    server.latency_s = 0.05
    probe = make_config(server.url)
    worst = scripted_request(probe, 0).worst_case_usd
    budget = 5.5 * worst  # room for 5 worst cases in flight
    cfg = make_config(server.url, budget_usd=budget, max_concurrency=40)
    reqs = [scripted_request(cfg, i) for i in range(40)]
    ledger = Ledger(tmp_path / "ledger.sqlite")
    res = replay_requests(reqs, cfg, {}, cache=ResponseCache(tmp_path / "c"), ledger=ledger, run_id="race")
    rows = res.table.to_pylist()
    answered = [r for r in rows if r["status"] == "answered"]
    exhausted = [r for r in rows if r["status"] == "budget_exhausted"]
    assert len(answered) + len(exhausted) == 40
    # settles free budget for more, but not for all
    assert 5 <= len(answered) < 40 and exhausted
    assert all("teacher budget" in r["reason"] for r in exhausted)
    assert ledger.spent("t1") <= budget
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(ledger.spent("t1"))
    assert len(server.requests) == len(answered)  # a refused reservation sends nothing


def test_run_ceiling_caps_one_run_but_not_the_next(tmp_path, server):
    probe = make_config(server.url)
    worst = scripted_request(probe, 0).worst_case_usd
    cfg = make_config(server.url, ceiling_usd=2.5 * worst, max_concurrency=1)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    cache = ResponseCache(tmp_path / "c")
    reqs = [scripted_request(cfg, i, pad=0) for i in range(30)]
    res = replay_requests(reqs, cfg, {}, cache=cache, ledger=ledger, run_id="run-a")
    s = res.summary
    assert s["budget_exhausted"] > 0 and s["answered"] > 2
    assert sum(spend_by_run(ledger, "run-a").values()) <= cfg.ceiling_usd
    assert all("run ceiling" in r["reason"] for r in res.table.to_pylist() if r["status"] == "budget_exhausted")
    res2 = replay_requests(reqs, cfg, {}, cache=cache, ledger=ledger, run_id="run-b")  # a new run: new ceiling
    assert res2.summary["from_cache"] == s["answered"] and res2.summary["answered"] > s["answered"]
    assert sum(spend_by_run(ledger, "run-b").values()) <= cfg.ceiling_usd


def test_budget_holds_across_runs_and_plan_reports_it(tmp_path, server):
    probe = make_config(server.url)
    worst = scripted_request(probe, 0).worst_case_usd
    cfg = make_config(server.url, budget_usd=3 * worst)
    ledger, cache = Ledger(tmp_path / "ledger.sqlite"), ResponseCache(tmp_path / "c")
    reqs = [scripted_request(cfg, i) for i in range(6)]
    plan = plan_requests(reqs, cfg, cache, ledger)
    assert plan.table.num_rows == 6 and not plan.fits and "teacher t1" in plan.reasons[0]
    assert plan.worst_case_by_teacher["t1"] == pytest.approx(6 * worst)
    replay_requests(reqs[:2], cfg, {}, cache=cache, ledger=Ledger(tmp_path / "ledger.sqlite"), run_id="day1")
    spent = ledger.spent("t1")
    # two calls settled at actual usage, below their worst cases
    assert 0 < spent < 2 * worst
    plan2 = plan_requests(reqs, cfg, cache, ledger)
    assert plan2.table.column("cached").to_pylist() == [True, True, False, False, False, False]
    assert plan2.worst_case_by_teacher["t1"] == pytest.approx(4 * worst)
    assert plan2.remaining_budget_by_teacher["t1"] == pytest.approx(3 * worst - spent)
    assert ledger.balance("t1", cfg.teachers[0].budget_usd).remaining_usd == pytest.approx(3 * worst - spent)


_WORKER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from replay.conftest import make_config, scripted_request
    from composer_pipeline.teachers.cache import ResponseCache
    from composer_pipeline.ledger import Ledger
    from composer_pipeline.replay.run import replay_requests
    cfg = make_config({url!r}, budget_usd={budget!r}, max_concurrency=20)
    reqs = [scripted_request(cfg, i, pad={pad}) for i in range(25)]
    res = replay_requests(reqs, cfg, {{}}, cache=ResponseCache({cache!r}), ledger=Ledger({ledger!r}), run_id={run!r})
    print(json.dumps(res.summary))
    """
)


# several CLI processes (test_budget_race_in_one_process is the fast twin)
@pytest.mark.slow
def test_budget_race_across_processes(tmp_path, server, repo_root):
    server.latency_s = 0.05
    probe = make_config(server.url)
    worst = scripted_request(probe, 0).worst_case_usd
    budget = 8.5 * worst
    ledger_path = tmp_path / "shared-ledger.sqlite"
    procs = []
    # different bodies per process (pad), separate caches: both really spend
    for k in range(2):
        code = _WORKER.format(
            tests=str(repo_root / "tests"),
            url=server.url,
            budget=budget,
            pad=k,
            cache=str(tmp_path / f"cache{k}"),
            ledger=str(ledger_path),
            run=f"p{k}",
        )
        procs.append(
            subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    summaries = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    ledger = Ledger(ledger_path)
    assert ledger.spent("t1") <= budget
    assert sum(s["budget_exhausted"] for s in summaries) > 0
    assert sum(s["answered"] for s in summaries) == len(server.requests) >= 8
