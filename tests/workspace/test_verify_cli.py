"""``composer-pipeline workspace verify``: one line per file-tool call of the stored states."""

from __future__ import annotations

import json

import pytest

from composer_pipeline.cli import main


def test_verify_prints_one_line_per_file_tool_state_with_prediction_and_observation(file_tool_store, capsys):
    assert main(["workspace", "verify", "--store", file_tool_store, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(set(r) == {"state_id", "tool", "predicted_ok", "observed_ok", "reason"} for r in rows)
    got = [(r["tool"], r["predicted_ok"], r["observed_ok"]) for r in rows]
    assert got == [
        ("Read", None, True),  # never seen: cannot tell
        ("Edit", True, True),  # read before, old_string once
        ("Edit", False, False),  # not read
        ("Read", None, False),  # not yet known missing
        ("Read", False, False),  # known missing now
    ]
    assert len({r["state_id"] for r in rows}) == 5


def test_verify_summary_and_clear_error(file_tool_store, capsys, tmp_path):
    assert main(["workspace", "verify", "--store", file_tool_store]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{") :])
    assert summary["file_tool_calls"] == 5 and summary["with_verdict"] == 3 and summary["agreement"] == 1.0
    assert summary["observed_failures"] == 3 and summary["failures_predicted"] == 2
    assert main(["workspace", "verify", "--store", str(tmp_path)]) == 2
    assert "no trace_states table" in capsys.readouterr().err


def test_workspace_without_its_subcommand_names_it(capsys):
    with pytest.raises(SystemExit) as e:
        main(["workspace"])
    assert e.value.code == 2 and "verify" in capsys.readouterr().err
