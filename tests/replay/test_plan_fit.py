"""The cost-plan fit is one decision (replay.plan.check_plan): the plan the CLI and the cost_plan
asset report and the blocking check that guards the replay read the same result from the same table."""

from __future__ import annotations

import pytest

from composer_pipeline.ledger import Ledger
from composer_pipeline.replay.plan import check_plan, plan_requests
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, scripted_request, teacher_dict


def test_the_check_reads_the_plan_decision_back_from_its_table(tmp_path, server):
    worst = scripted_request(make_config(server.url), 0).worst_case_usd
    cfg = make_config(
        server.url,
        ceiling_usd=10 * worst,
        teachers=[
            teacher_dict(server.url, "rich", budget_usd=100 * worst),
            teacher_dict(server.url, "poor", budget_usd=2 * worst),
        ],
    )
    ledger, cache = Ledger(tmp_path / "ledger.sqlite"), ResponseCache(tmp_path / "c")
    reqs = [scripted_request(cfg, i, teacher=t) for i in range(4) for t in (0, 1)]
    plan = plan_requests(reqs, cfg, cache, ledger)
    again = check_plan(plan.table, cfg, ledger)  # what the blocking asset check computes
    assert (
        (again.fits, again.reasons, again.over_budget)
        == (plan.fits, plan.reasons, plan.over_budget)
        == (False, plan.reasons, ["poor"])
    )
    assert (
        again.worst_case_by_teacher
        == plan.worst_case_by_teacher
        == pytest.approx({"rich": 4 * worst, "poor": 4 * worst})
    )
    assert again.total_worst_case_usd == pytest.approx(8 * worst) and "teacher poor" in plan.reasons[0]
    # the ceiling alone: every teacher within budget, the run over it
    tight = make_config(
        server.url, ceiling_usd=3 * worst, teachers=[teacher_dict(server.url, "rich", budget_usd=100 * worst)]
    )
    only_rich = plan_requests([scripted_request(tight, i) for i in range(4)], tight, cache, ledger)
    assert not only_rich.fits and only_rich.over_budget == [] and "ceiling_usd" in only_rich.reasons[0]
    assert check_plan(only_rich.table, tight, ledger).fits is False
