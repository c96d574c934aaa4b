"""The whole Definitions load (a broken import or wiring error fails CI)."""

import dagster as dg


def test_definitions_load_and_resolve():
    from assets.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {
        "raw_sessions",
        "trace_states",
        "trace_messages",
        "quarantine",
        "cost_plan",
        "teacher_replays",
        "dpo_pairs",
        "agreement_positives",
        "pairs_dropped_at_build",
        "normalized_dpo_pairs",
        "dropped_pairs",
        "training_set",
        "trained_policy",
        "policy_eval",
    } <= keys
    repo = defs.get_repository_def()
    assert repo.get_sensor_def("sessions_sensor")
    sched = repo.get_schedule_def("nightly_training")
    assert sched.cron_schedule == "0 3 * * *" or sched.cron_schedule.count(" ") == 4
    assert defs.resolve_job_def("session_chain")
    # the cost guard is a separate blocking check upstream of the spend
    checks = {k.name: k for k in defs.resolve_asset_graph().asset_check_keys}
    assert "cost_plan_within_budget" in checks
    assert isinstance(defs.executor, dg.ExecutorDefinition) and defs.executor.name == "in_process"
