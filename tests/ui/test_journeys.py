"""The four user journeys (and a failing cost check, and shutting the UI down), clicked through the
real Dagster UI, asserting what a user reads there.

All tests share ONE ``dagster dev`` (see conftest) and run in file order, each building on the last:
journey 1 materializes the first session, 3 audits its pairs, 4 trains, the cost check blocks a second
session, journey 2 turns the sensor on (which must not re-run the first session) and backfills, and
the last test stops ``dagster dev`` and looks for leftover teacher servers. GraphQL is used only to
*wait* for what the UI launched, and to register a partition where the journey under test is not the
sensor's. Screenshots go to ``artifacts/ui/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ui_kit import LOCATION, hover_until_shown, move_session, shot, teacher_server_pids

pytestmark = pytest.mark.slow  # a real dagster dev driven by Chromium

CHAIN = [
    "raw_sessions",
    "trace_states",
    "trace_messages",
    "cost_plan",
    "teacher_replays",
    "dpo_pairs",
    "normalized_…_pairs",
    "training_set",
    "trained_policy",
    "policy_eval",
]
CLI = [sys.executable, "-m", "composer_pipeline"]


def _session_keys(ui) -> list[str]:
    """The partition keys of the sessions under the trace root, as the sensor names them: short and
    readable (``calc/a1f0c3d2``; the long session key is in raw_sessions' metadata)."""
    from composer_pipeline.ingest.discover import discover_sessions
    from composer_pipeline.ingest.partition_keys import KeyMap

    keymap = KeyMap([s.key for s in discover_sessions(ui.trace_root)], ui.partition_keys())
    keymap.assign()
    keys = sorted(keymap.partition_of.values())
    assert all(k.startswith("calc/") and len(k) == len("calc/a1f0c3d2") for k in keys), keys
    return keys


def add_spare_session(ui) -> str:
    """Drop the next sample session (main file last, after its subagent files) into the watched trace
    root; its partition key."""
    from composer_pipeline.ingest.partition_keys import KeyMap

    session_key = move_session(ui.spare, ui.trace_root)
    keymap = KeyMap([session_key], ui.partition_keys())
    return keymap.partition_of.get(session_key) or keymap.assign()[session_key]


def register_partition(ui, key: str) -> None:
    """What the sessions sensor does for a new session (journey 2 tests the sensor itself)."""
    out = ui.gql(
        """mutation($k: String!) { addDynamicPartition(
             repositorySelector: {repositoryLocationName: "%s", repositoryName: "__repository__"},
             partitionsDefName: "sessions", partitionKey: $k) { __typename } }"""
        % LOCATION,
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
    # the visible entry: Dagster's MiddleTruncate renders each name twice, once in a hidden measuring
    # node, and which one comes first in the DOM varies (it once cost a 60 s timeout)
    page.get_by_text(key, exact=True).filter(visible=True).first.click()
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
    page.wait_for_function("id => document.getElementById(id).checked", arg=switch.get_attribute("for"), timeout=30_000)


def test_journey_1_materialize_a_partition(ui, page):
    (key,) = _session_keys(ui)
    register_partition(ui, key)

    # The whole chain is visible as one lineage graph.
    page.goto(ui.url + "/assets/policy_eval?view=lineage&lineageScope=upstream&lineageDepth=20")
    for name in CHAIN:
        page.get_by_text(name, exact=True).first.wait_for()
    shot(page, "journey1-asset-chain")
    # ...and on the global graph (Lineage in the left bar) every asset is drawn by name at once, with
    # no group to expand first (one asset group; the stage is a tag, shown on each asset's page)
    page.goto(ui.url + "/overview")
    page.get_by_role("link", name="Lineage").first.click()
    page.get_by_text("Global asset lineage").first.wait_for()
    page.get_by_text(
        "normalized_…_pairs",
        exact=True,
        # the graph's label (the list has the full name)
    ).first.wait_for()
    for name in CHAIN:
        assert page.get_by_text(name, exact=True).count() >= (1 if "…" in name else 2), name  # list + graph node
    assert page.get_by_text("Expand all groups").count() == 0
    shot(page, "journey1-global-lineage")

    run = materialize_session_in_ui(page, ui, key, "journey1")
    assert run["status"] == "SUCCESS", ui.log.read_text()[-3000:]

    page.goto(ui.url + f"/runs/{run['runId']}")
    page.get_by_text("Success", exact=True).first.wait_for()
    page.get_by_text(f"partition: {key}").first.wait_for()
    shot(page, "journey1-run-success")
    assert teacher_server_pids(ui.state_dir), "the run did not start the local teacher server"

    # Every check passed, names the session it ran on, and says what it checks.
    descriptions = {
        "trace_states": {
            "parse_success_ratio": "Parsed lines / all lines ≥ threshold.",
            "schema": "All three tables match tables.py.",
        },
        "cost_plan": {"cost_plan_within_budget": "Blocks the replay when the worst case"},
        "teacher_replays": {
            "error_rate": "Failed calls / all calls ≤ threshold.",
            "spend_within_ceiling": "Actual spend of this run ≤ the ceiling",
        },
        "normalized_dpo_pairs": {
            "non_empty_chosen_rejected": "Every kept pair has a non-blank chosen and rejected text.",
            "chosen_differs_from_rejected": "No kept pair prefers an action over the identical action.",
        },
    }
    for asset, checks in descriptions.items():
        page.goto(ui.url + f"/assets/{asset}?view=checks")
        page.get_by_text("Passed").first.wait_for()
        assert page.get_by_text("Failed", exact=True).count() == 0, asset
        for check, text in checks.items():
            page.get_by_text(check, exact=True).filter(visible=True).first.click()
            page.get_by_text(text).first.wait_for()
            # the latest result names the partition it ran on (it said "Partition —" before)
            page.locator("text=Partition").first.wait_for()
            page.get_by_text(key, exact=True).first.wait_for()
        shot(page, f"journey1-checks-{asset}")
    # the check's history lists results per partition; the short key fits its column
    page.get_by_text("Execution history", exact=True).first.click()
    cell = page.locator("td", has_text=key).first
    cell.wait_for()
    assert cell.evaluate("td => td.scrollWidth <= td.clientWidth"), "the partition key overflows its column"
    shot(page, "journey1-check-history")
    assert ui.teachers.requests, "the replay sent no request to the teachers"

    # The pairs say which kind of agreement they have: two distinct models agreed.
    page.goto(ui.url + f"/assets/normalized_dpo_pairs?partition={key}")
    page.get_by_text("pairs_by_agreement_kind").first.wait_for()
    shot(page, "journey1-pairs-agreement-kind")
    page.get_by_text("cross_model").first.wait_for()
    page.get_by_text(
        "2 of 2 models"
        # the preview's `agreement` column (the local tiny model's cut answers never vote)
    ).first.wait_for()
    shot(page, "journey1-pairs-agreement-kind")


def test_journey_3_audit_pair_lineage(ui, page):
    page.goto(ui.url + "/assets/normalized_dpo_pairs")
    page.get_by_role("tab", name="Lineage").click()
    page.get_by_role("button", name="Upstream").click()
    page.get_by_role("button", name="All", exact=True).click()  # graph depth: all the way up
    for name in ("trace_states", "teacher_replays", "dpo_pairs", "raw_sessions"):
        page.get_by_text(name, exact=True).first.wait_for()
    shot(page, "journey3-pair-lineage")

    # The example pair in the metadata (rendered inline): the kind of agreement and who agreed.
    page.goto(ui.url + "/assets/normalized_dpo_pairs")
    page.get_by_text("pairs_by_agreement_kind").first.wait_for()
    page.get_by_text("example", exact=True).first.scroll_into_view_if_needed()
    # the example is show's pair view, long enough that the table offers it behind a link
    page.get_by_text("[Show Markdown]").first.click()
    page.get_by_text("agreement: cross_model").first.wait_for()
    page.get_by_text("2 of 2 models; teachers: teacher_a, teacher_b").first.wait_for()
    page.get_by_text("chosen (teacher consensus)").first.wait_for()
    # the dialog's fade-in, so the screenshot shows it
    page.wait_for_timeout(600)
    shot(page, "journey3-example-pair")

    # Row level: pick a pair, follow it down to the raw JSONL lines.
    out = subprocess.run(
        CLI
        + [
            "sql",
            "select pair_id from normalized_dpo_pairs order by pair_id limit 1",
            "--json",
            "--store",
            str(ui.store),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pair_id = json.loads(out.stdout)[0]["pair_id"]
    out = subprocess.run(
        CLI + ["lineage", pair_id, "--store", str(ui.store), "--json"], capture_output=True, text=True, check=True
    )
    chain = json.loads(out.stdout)
    raw = chain["records"]
    assert raw and not chain["missing"], chain
    for line in raw:
        src = ui.trace_root / line["source_file"]
        original = src.read_text().splitlines()[line["line_no"] - 1]
        rec = json.loads(line["raw"])
        assert rec.get("uuid") and rec["uuid"] in original
    human = subprocess.run(
        CLI + ["lineage", pair_id, "--store", str(ui.store)], capture_output=True, text=True, check=True
    ).stdout
    assert pair_id in human and raw[0]["source_file"] in human
    assert "agreement cross_model: 2 of 2 models" in human and "/repo/app.py" in human  # the consensus text


def test_journey_4_nightly_training_from_the_schedule(ui, page):
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
    # let the dialog's fade-in finish before the screenshot
    page.wait_for_timeout(800)
    shot(page, "journey4-loss-curves")
    page.keyboard.press("Escape")
    page.goto(ui.url + "/assets/policy_eval")
    page.get_by_text("preference_accuracy").first.wait_for()
    shot(page, "journey4-policy-eval")


def test_failing_cost_check_blocks_downstream_and_says_why(ui, page):
    # a second session, never replayed: its worst case is not cached
    key = add_spare_session(ui)
    register_partition(ui, key)
    original = ui.teachers_yaml.read_text()
    doc = yaml.safe_load(original)
    doc["ceiling_usd"] = 1e-9
    ui.teachers_yaml.write_text(yaml.safe_dump(doc))  # read by each run: this run's ceiling
    try:
        n_requests = len(ui.teachers.requests)
        run = materialize_session_in_ui(page, ui, key, "costcheck")
    finally:
        ui.teachers_yaml.write_text(original)
    assert run["status"] == "FAILURE"
    assert len(ui.teachers.requests) == n_requests, "the replay spent although the cost check failed"

    page.goto(ui.url + "/assets/cost_plan?view=checks")
    page.get_by_text("Failed").first.wait_for()
    # the failed result names the session it blocked
    page.get_by_text(key).first.wait_for()
    shot(page, "costcheck-failed")
    # The run page says which check stopped it; the replay step never started.
    page.goto(ui.url + f"/runs/{run['runId']}")
    page.get_by_text("Failure", exact=True).first.wait_for()
    page.get_by_text("cost_plan_within_budget").first.wait_for()
    shot(page, "costcheck-run-blocked")
    assert not list(Path(ui.store).glob(f"teacher_replays/{key}.parquet"))


def test_journey_2_sensor_adds_new_sessions_and_backfill_hits_the_cache(ui, page):
    done_key, blocked_key = _session_keys(ui)[0], None
    materialized = set(_session_keys(ui))
    n_before = len(ui.runs())
    # Turn the sensor on from the Automation page. Its first tick sees both sessions: the first went
    # through its whole chain already (no second run); the second was stopped by the cost check (runs).
    switch_on(page, ui, "sessions_sensor")
    shot(page, "journey2-sensor-on")
    runs = ui.wait_runs_done(n_before + 1, timeout=240)
    sensor_runs = [r for r in runs if any(t["key"] == "dagster/sensor_name" for t in r["tags"])]
    keys = [next(t["value"] for t in r["tags"] if t["key"] == "dagster/partition") for r in sensor_runs]
    blocked_key = next(k for k in materialized if k != done_key)
    # no extra run for the session already materialized
    assert keys == [blocked_key], keys
    assert all(r["status"] == "SUCCESS" for r in sensor_runs), sensor_runs

    # Drop a new session into the watched trace root: the sensor adds its partition and runs it.
    new_key = add_spare_session(ui)
    deadline = time.time() + 240
    while new_key not in ui.partition_keys() and time.time() < deadline:
        time.sleep(2)
    assert new_key in ui.partition_keys()
    runs = ui.wait_runs_done(n_before + 2, timeout=300)
    sensor_runs = [r for r in runs if any(t["key"] == "dagster/sensor_name" for t in r["tags"])]
    assert len(sensor_runs) == 2 and all(r["status"] == "SUCCESS" for r in runs[:2]), runs
    n_runs = len(runs)
    paid_before = len(ui.teachers.requests)
    assert paid_before > 0

    # What each answer cost when it was bought, before the backfill (the audit must not change it).
    def costs() -> dict:
        from composer_pipeline.store import Store

        t = Store(str(ui.store)).read_table("teacher_replays").to_pylist()
        return {(r["state_id"], r["teacher"]): (r["cost_usd"], r["paid_usd"]) for r in t}

    bought = costs()
    assert any(cost > 0 and paid == cost for cost, paid in bought.values()), bought

    # Backfill the replay over every partition from the UI: all already replayed, so no new spend.
    page.goto(ui.url + "/assets/teacher_replays")
    page.get_by_role("button", name="Materialize…").first.click()
    dialog = page.locator("[role=dialog]").first
    dialog.get_by_role("button", name="All", exact=True).click()
    shot(page, "journey2-backfill-dialog")
    dialog.get_by_role("button", name="Launch backfill").click()
    runs = ui.wait_runs_done(n_runs + 3, timeout=300)
    backfill_runs = [r for r in runs if any(t["key"] == "dagster/backfill" for t in r["tags"])]
    assert len(backfill_runs) == 3 and all(r["status"] == "SUCCESS" for r in backfill_runs), runs
    assert len(ui.teachers.requests) == paid_before, "a backfill over replayed states paid again"
    # the backfill daemon marks it completed on its next tick
    deadline = time.time() + 120
    while True:
        page.goto(ui.url + "/overview/backfills")
        page.get_by_text("3 partitions").first.wait_for()
        if page.get_by_text("Success", exact=True).count() or time.time() > deadline:
            break
        page.wait_for_timeout(3000)
    shot(page, "journey2-backfill-done")
    assert page.get_by_text("Success", exact=True).count() == 1

    # The backfill kept what every answer cost when bought (cost_usd) and paid nothing (paid_usd 0).
    after = costs()
    assert set(after) == set(bought)
    assert all(after[k][0] == bought[k][0] for k in bought), "a backfill rewrote what an answer cost"
    assert all(paid == 0 for _, paid in after.values()), "a backfill over replayed states paid again"

    # The replay metadata names what it counts: every answer came from the cache, no request was sent;
    # the preview shows both money columns.
    page.goto(ui.url + "/assets/teacher_replays")
    page.get_by_text("http_requests").first.wait_for()
    page.get_by_text("from_cache").first.wait_for()
    page.get_by_text("paid_usd", exact=True).first.wait_for()
    page.get_by_text("cost_usd", exact=True).first.wait_for()
    shot(page, "journey2-replay-metadata")

    # The sensor's page names the folder it watches, and a tick that requested nothing says why: the
    # tick list shows "0 runs requested", and hovering it shows the sensor's skip reason.
    page.goto(ui.url + f"/locations/{LOCATION}/sensors/sessions_sensor")
    page.get_by_text(str(ui.trace_root), exact=False).first.wait_for()  # the description: "Watches <root> ..."

    # a row of the tick list (the page's "Latest tick" line above it carries the same tag)
    def skipped():
        return page.locator("tr", has_text="View logs").first.get_by_text("0 runs requested", exact=True).first

    def reason():
        return page.get_by_text(f"sessions under {ui.trace_root}, none new or changed", exact=False).first

    # ticks every 5 s here, and nothing new has arrived since the backfill
    skipped().wait_for(timeout=60_000)
    hover_until_shown(page, skipped, reason)
    shot(page, "journey2-sensor-skip-reason")


def test_stopping_dagster_dev_leaves_no_teacher_server(ui):
    """SIGTERM to `dagster dev` (what a service manager or `kill` sends): it exits within seconds, and
    the local teacher server the runs started goes with it."""
    assert teacher_server_pids(ui.state_dir), "no run started a local teacher server"
    t0 = time.monotonic()
    os.kill(ui.proc.pid, signal.SIGTERM)
    try:
        ui.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("dagster dev did not stop within 30 s of SIGTERM:\n" + ui.log.read_text()[-3000:])
    stopped_s = time.monotonic() - t0
    deadline = time.monotonic() + 15
    while teacher_server_pids(ui.state_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert teacher_server_pids(ui.state_dir) == [], "a teacher server outlived dagster dev"
    assert stopped_s < 30
