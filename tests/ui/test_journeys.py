"""The four user journeys (and a failing cost check), clicked through the real Dagster UI.

Each test starts its own ``dagster dev`` (see conftest) and drives it in headless Chromium the way a
user would. GraphQL is used only to *wait* for what the UI launched, and to register a partition
where the journey under test is not the sensor's. Screenshots go to ``artifacts/ui/``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

import pytest
from conftest import LOCATION, SAMPLES, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # a real `dagster dev` + headless Chromium per test

CHAIN = [
    "raw_sessions", "trace_states", "trace_messages", "cost_plan", "teacher_replays", "dpo_pairs",
    "normalized_…_pairs", "training_set", "trained_policy", "policy_eval",
]
CLI = [sys.executable, "-m", "composer_pipeline"]


def _first_session_key(ui) -> str:
    from composer_pipeline.ingest.discover import discover_sessions

    return sorted(s.key for s in discover_sessions(ui.trace_root))[0]


def register_partition(ui, key: str) -> None:
    """What the sessions sensor does for a new session (journey 2 tests the sensor itself)."""
    out = ui.gql(
        """mutation($k: String!) { addDynamicPartition(
             repositorySelector: {repositoryLocationName: "%s", repositoryName: "__repository__"},
             partitionsDefName: "sessions", partitionKey: $k) { __typename } }""" % LOCATION,
        {"k": key},
    )
    assert out["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess", out


def materialize_session_in_ui(page, ui, key: str, name: str) -> dict:
    """Jobs → session_chain → Materialize all… → pick the partition → Launch 1 run; wait for it."""
    n_before = len(ui.runs())
    page.goto(ui.url + f"/locations/{LOCATION}/jobs/session_chain")
    page.get_by_role("button", name="Materialize all…").first.click()
    dialog = page.locator("[role=dialog]").first
    page.get_by_text("Select a partition or create one").click()
    page.get_by_text("Select all (1)").click()
    page.keyboard.press("Escape")
    shot(page, f"{name}-launch-dialog")
    dialog.get_by_role("button", name="Launch 1 run").click()
    runs = ui.wait_runs_done(n_before + 1, timeout=300)
    run = runs[0]  # newest first
    assert {"key": "dagster/partition", "value": key} in run["tags"], run
    return run


def switch_on(page, ui, name: str) -> None:
    """Automation page: flip the on/off switch of one sensor or schedule."""
    page.goto(ui.url + "/automation")
    row = page.locator("div[class*='ListItem_listItem']", has_text=name).first
    switch = row.locator("label[class*='formatSwitch']")
    switch.click()
    page.wait_for_function(
        "id => document.getElementById(id).checked", arg=switch.get_attribute("for"), timeout=30_000
    )


def test_journey_1_materialize_a_partition(start_dagster, page):
    ui = start_dagster(sessions=1)
    key = _first_session_key(ui)
    register_partition(ui, key)

    # The whole chain is visible as one lineage graph.
    page.goto(ui.url + "/assets/policy_eval?view=lineage&lineageScope=upstream&lineageDepth=20")
    for name in CHAIN:
        page.get_by_text(name, exact=True).first.wait_for()
    shot(page, "journey1-asset-chain")

    run = materialize_session_in_ui(page, ui, key, "journey1")
    assert run["status"] == "SUCCESS", ui.log.read_text()[-3000:]

    page.goto(ui.url + f"/runs/{run['runId']}")
    page.get_by_text("Success", exact=True).first.wait_for()
    page.get_by_text(f"partition: {key}").first.wait_for()
    shot(page, "journey1-run-success")

    # Asset checks passed: the blocking budget check upstream of the spend, and the ingest checks.
    for asset in ("cost_plan", "trace_states", "teacher_replays"):
        page.goto(ui.url + f"/assets/{asset}?view=checks")
        page.get_by_text("Passed").first.wait_for()
        assert page.get_by_text("Failed", exact=True).count() == 0, asset
        shot(page, f"journey1-checks-{asset}")
    assert ui.teachers.requests, "the replay sent no request to the teachers"


def test_journey_2_sensor_adds_new_sessions_and_backfill_hits_the_cache(start_dagster, page):
    ui = start_dagster(sessions=1)
    # Turn the sensor on from the Automation page.
    switch_on(page, ui, "sessions_sensor")
    shot(page, "journey2-sensor-on")
    runs = ui.wait_runs_done(1, timeout=240)
    assert all(r["status"] == "SUCCESS" for r in runs), runs

    # Drop two new sessions into the watched trace root: the sensor adds their partitions and runs.
    project = next(ui.trace_root.iterdir())
    for src in sorted(p for p in (SAMPLES / project.name).glob("*.jsonl") if not (project / p.name).exists()):
        if src.with_suffix("").is_dir():  # subagent files first, so the sensor sees whole sessions
            shutil.copytree(src.with_suffix(""), project / src.stem, dirs_exist_ok=True)
        shutil.copy(src, project / src.name)
    deadline = time.time() + 240
    while len(ui.partition_keys()) < 3 and time.time() < deadline:
        time.sleep(2)
    assert len(ui.partition_keys()) == 3
    runs = ui.wait_runs_done(3, timeout=300)
    assert all(r["status"] == "SUCCESS" for r in runs), runs
    n_sensor_runs = len(runs)
    paid_before = len(ui.teachers.requests)
    assert paid_before > 0

    # Backfill the replay over every partition from the UI: all already replayed, so no new spend.
    page.goto(ui.url + "/assets/teacher_replays")
    page.get_by_role("button", name="Materialize…").first.click()
    dialog = page.locator("[role=dialog]").first
    dialog.get_by_role("button", name="All", exact=True).click()
    shot(page, "journey2-backfill-dialog")
    dialog.get_by_role("button", name="Launch backfill").click()
    runs = ui.wait_runs_done(n_sensor_runs + 3, timeout=300)
    backfill_runs = [r for r in runs if any(t["key"] == "dagster/backfill" for t in r["tags"])]
    assert len(backfill_runs) == 3 and all(r["status"] == "SUCCESS" for r in runs), runs
    assert len(ui.teachers.requests) == paid_before, "a backfill over replayed states paid again"
    deadline = time.time() + 120  # the backfill daemon marks it completed on its next tick
    while True:
        page.goto(ui.url + "/overview/backfills")
        page.get_by_text("3 partitions").first.wait_for()
        if page.get_by_text("Success", exact=True).count() or time.time() > deadline:
            break
        page.wait_for_timeout(3000)
    shot(page, "journey2-backfill-done")
    assert page.get_by_text("Success", exact=True).count() == 1

    # The replay metadata of the last materialization says every call was a cache hit.
    page.goto(ui.url + "/assets/teacher_replays")
    page.get_by_text("cache_hits").first.wait_for()
    shot(page, "journey2-replay-metadata")


def test_journey_3_audit_pair_lineage(start_dagster, page):
    ui = start_dagster(sessions=1)
    key = _first_session_key(ui)
    register_partition(ui, key)
    run = materialize_session_in_ui(page, ui, key, "journey3")
    assert run["status"] == "SUCCESS"

    page.goto(ui.url + "/assets/normalized_dpo_pairs")
    page.get_by_role("tab", name="Lineage").click()
    page.get_by_role("button", name="Upstream").click()
    page.get_by_role("button", name="All", exact=True).click()  # graph depth: all the way up
    for name in ("trace_states", "teacher_replays", "dpo_pairs", "raw_sessions"):
        page.get_by_text(name, exact=True).first.wait_for()
    shot(page, "journey3-pair-lineage")

    # Row level: pick a pair, follow it down to the raw JSONL lines.
    out = subprocess.run(CLI + ["sql", "select pair_id from normalized_dpo_pairs order by pair_id limit 1", "--json",
                                "--store", str(ui.store)], capture_output=True, text=True, check=True)
    pair_id = json.loads(out.stdout)[0]["pair_id"]
    out = subprocess.run(CLI + ["lineage", pair_id, "--store", str(ui.store), "--json"],
                         capture_output=True, text=True, check=True)
    chain = json.loads(out.stdout)
    raw = chain["records"]
    assert raw and not chain["missing"], chain
    for line in raw:
        src = ui.trace_root / line["source_file"]
        original = src.read_text().splitlines()[line["line_no"] - 1]
        rec = json.loads(line["raw"])
        assert rec.get("uuid") and rec["uuid"] in original
    human = subprocess.run(CLI + ["lineage", pair_id, "--store", str(ui.store)], capture_output=True, text=True,
                           check=True).stdout
    assert pair_id in human and raw[0]["source_file"] in human


def test_journey_4_nightly_training_from_the_schedule(start_dagster, page):
    ui = start_dagster(sessions=1)
    key = _first_session_key(ui)
    register_partition(ui, key)
    assert materialize_session_in_ui(page, ui, key, "journey4")["status"] == "SUCCESS"

    page.goto(ui.url + "/automation")
    page.get_by_text("At 03:00 AM UTC").first.wait_for()
    switch_on(page, ui, "nightly_training")
    shot(page, "journey4-schedule-on")

    page.goto(ui.url + f"/locations/{LOCATION}/schedules/nightly_training")
    page.get_by_text("(0 3 * * *)").first.wait_for()
    n_before = len(ui.runs())
    page.get_by_role("button", name="Preview tick result").click()
    dialog = page.locator("[role=dialog]").first
    dialog.get_by_role("button", name="Continue").click()
    dialog.get_by_role("button", name="Launch all & commit tick result").click()
    runs = ui.wait_runs_done(n_before + 1, timeout=420)
    assert runs[0]["jobName"] == "nightly_training"
    assert runs[0]["status"] == "SUCCESS", ui.log.read_text()[-4000:]

    page.goto(ui.url + "/assets/trained_policy")
    for label in ("grpo", "sdpo", "dpo"):
        page.get_by_text(label).first.wait_for()
    shot(page, "journey4-trained-policy")
    # Markdown metadata opens in a dialog: the per-channel loss curves are a PNG inside it.
    page.locator("tr", has_text="loss_curves").get_by_text("Show Markdown").click()
    page.locator("[role=dialog] img[src^='data:image/png']").first.wait_for()
    page.wait_for_timeout(800)  # let the dialog's fade-in finish before the screenshot
    shot(page, "journey4-loss-curves")
    page.keyboard.press("Escape")
    page.goto(ui.url + "/assets/policy_eval")
    page.get_by_text("preference_accuracy").first.wait_for()
    shot(page, "journey4-policy-eval")


def test_failing_cost_check_blocks_downstream_and_says_why(start_dagster, page):
    ui = start_dagster(sessions=1, ceiling_usd=1e-9)
    key = _first_session_key(ui)
    register_partition(ui, key)
    run = materialize_session_in_ui(page, ui, key, "costcheck")
    assert run["status"] == "FAILURE"
    assert ui.teachers.requests == [], "the replay spent although the cost check failed"

    page.goto(ui.url + "/assets/cost_plan?view=checks")
    page.get_by_text("Failed").first.wait_for()
    page.get_by_text("ceiling_usd").first.wait_for()
    shot(page, "costcheck-failed")
    # The run page says which check stopped it; the replay step never started.
    page.goto(ui.url + f"/runs/{run['runId']}")
    page.get_by_text("Failure", exact=True).first.wait_for()
    page.get_by_text("cost_plan_within_budget").first.wait_for()
    shot(page, "costcheck-run-blocked")
    assert not list(Path(ui.store).glob("teacher_replays/*.parquet"))
