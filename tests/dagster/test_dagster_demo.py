"""``composer-pipeline demo`` logic (assets.demo.run_demo) on a tmp instance, store and trace root,
with keyless teachers on a real loopback server; training skipped (covered by the full-chain test)."""

import os

import pytest
from dagster_sessions import SESSION_ID, write_session, write_teachers_yaml

from assets.demo import print_report, run_demo


# every session through the whole chain (the other tests here cover each asset)
@pytest.mark.slow
def test_demo_runs_every_session_through_dagster(tmp_path, scripted_server, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", os.environ.get("DAGSTER_HOME", ""))  # restored after the test
    root = tmp_path / "projects"
    write_session(root, "-home-dev-proj", SESSION_ID)
    write_session(root, "-home-dev-two", "22222222-0000-0000-0000-000000000002", n_steps=2)
    teachers = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url)
    monkeypatch.setenv(
        "COMPOSER_PIPELINE_RECIPE",
        str(tmp_path / "none.yaml"),
        # defaults, nothing from the repo's state
    )
    monkeypatch.setenv("COMPOSER_PIPELINE_HOME", str(tmp_path / "home"))  # the default ledger and cache: fresh
    lines: list[str] = []
    report = run_demo(
        trace_root=root,
        store=tmp_path / "store",
        skip_train=True,
        teachers=teachers,
        echo=lines.append,
        dagster_home=tmp_path / "dh",
    )
    assert report.failed == {}
    assert len(report.sessions) == 2
    assert report.row_counts["trace_states"] == 4 + 3
    assert report.row_counts["teacher_replays"] == 3 * 7
    from composer_pipeline.store import Store

    replays = Store(str(tmp_path / "store")).read_table("teacher_replays")
    # both sessions open with the same prompt
    hits = sum(replays.column("cache_hit").to_pylist())
    assert hits > 0 and len(scripted_server.requests) == replays.num_rows - hits
    assert (
        report.row_counts["training_set"]
        == report.row_counts["normalized_dpo_pairs"] + report.row_counts["agreement_positives"]
    )
    assert (tmp_path / "dh" / "dagster.yaml").is_file()
    print_report(report, echo=lines.append)
    text = "\n".join(lines)
    assert f"--store {tmp_path / 'store'}" in text and "dagster dev -w workspace.yaml" in text
    from composer_pipeline.ingest import native

    engine = "native" if native.AVAILABLE else "python"
    assert report.ingest_engines == {engine: 2} and f"{engine}: 2 of 2 sessions" in text
