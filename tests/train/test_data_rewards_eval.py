"""Data loading (split, hints, bad rows), rewards, held-out evaluation, CLI and the Pipes entry point."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from composer_pipeline import tables
from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.store import Store
from composer_pipeline.train import rewards
from composer_pipeline.train.config import HintTemplates, TrainRecipe
from composer_pipeline.train.data import interleave_error_sites, is_heldout, load_train_data
from composer_pipeline.train.hints import build_hint, error_text
from tests.support.synthetic_train import pair_rows, write_store


def test_load_split_hints_and_quarantine(tmp_path):
    rows = pair_rows(12)
    rows[0] = dict(rows[0], prompt="{not json")
    rows[4] = dict(rows[4], chosen_text=rows[4]["rejected_text"])
    Store(str(tmp_path)).write_table(
        "pairs", tables.conform(pa.Table.from_pylist([r for r in rows if r["kind"] == "pair"]), "normalized_dpo_pairs")
    )
    d = load_train_data(str(tmp_path), heldout_fraction=0.3, hints=HintTemplates())
    reasons = {s.row_id: s.reason for s in d.skipped}
    assert "JSONDecodeError" in reasons[rows[0]["pair_id"]]
    assert reasons[rows[4]["pair_id"]] == "chosen_text == rejected_text"
    ids = {p.state_id for p in d.prompts} | {p.state_id for p in d.heldout_prompts}
    assert rows[0]["state_id"] not in ids
    assert all(is_heldout(p.state_id, 0.3) for p in d.heldout_prompts + d.heldout_pairs)
    assert not any(is_heldout(p.state_id, 0.3) for p in d.prompts + d.pairs)
    again = load_train_data(str(tmp_path), heldout_fraction=0.3, hints=HintTemplates())
    assert [p.state_id for p in again.heldout_prompts] == [p.state_id for p in d.heldout_prompts]
    err = [p for p in d.prompts + d.heldout_prompts if p.has_error]
    assert err and all("File has not been read yet" in p.hint and "A better next step" in p.hint for p in err)
    assert all(p.hint is None for p in d.prompts if not p.has_error)


def test_hint_templates_and_error_text():
    agent = Action(tool_calls=(ToolCall("Edit", {"file_path": "/a"}),)).to_json()
    err = orjson.dumps(
        [{"tool_use_id": "x", "tool_name": "Edit", "content": [{"type": "text", "text": "boom"}]}]
    ).decode()
    assert error_text(err) == "Edit: boom"
    assert build_hint(agent, None, None, HintTemplates()) is None
    h = build_hint(agent, err, agent, HintTemplates())  # consensus == agent: no "better step"
    assert "Take a different next step" in h and "boom" in h
    with pytest.raises(ValueError, match="unknown keys"):
        HintTemplates.from_dict({"nope": 1})


def test_interleave_puts_an_error_site_in_each_block():
    d = load_train_data(write_store_tmp(), heldout_fraction=0.0, hints=HintTemplates())
    order = interleave_error_sites(d.prompts, 2, seed=0)
    assert sorted(p.state_id for p in order) == sorted(p.state_id for p in d.prompts)
    n_err = sum(p.hint is not None for p in order)
    blocks = [order[i : i + 2] for i in range(0, len(order), 2)]
    assert sum(any(p.hint for p in b) for b in blocks) == min(n_err, len(blocks))


def write_store_tmp():
    import tempfile

    return write_store(tempfile.mkdtemp(prefix="train-synth-"))


def test_rewards_are_computed_from_the_data():
    chosen = Action(tool_calls=(ToolCall("Read", {"file_path": "/repo/a.py"}),))
    good = chosen.to_text()
    wrong_tool = Action(tool_calls=(ToolCall("Delete", {"file_path": "/repo/a.py"}),)).to_text()
    broken = '<tool_call>\n{"name": "Read", "arguments": \n</tool_call>'
    comps = [good, wrong_tool, broken, "just text"]
    kw = dict(tool_names=[["Read", "Bash"]] * 4, consensus=[chosen.to_json()] * 3 + [""], consensus_text=[good] * 4)
    assert rewards.valid_action(None, comps, **kw) == [1.0, 1.0, 0.0, 1.0]
    assert rewards.known_tool(None, comps, **kw) == [1.0, 0.0, 0.0, 0.5]
    assert rewards.consensus_match(None, comps, **kw) == [1.0, 0.0, 0.0, None]
    shaped = rewards.format_shaped(None, comps, **kw)
    assert shaped[0] == pytest.approx(1.0) and shaped[0] > shaped[1] > shaped[3] and len(set(shaped)) == 4
    with pytest.raises(ValueError, match="unknown reward"):
        rewards.resolve(["valid_action", "nope"])
    assert rewards.tool_names_of(orjson.dumps([{"type": "function", "function": {"name": "Read"}}]).decode()) == [
        "Read"
    ]


def test_evaluate_policy_is_deterministic_and_compare_flags_regressions(tiny_model_dir, synth_store):
    from composer_pipeline.train.evaluate import compare, evaluate_policy

    recipe = TrainRecipe.from_dict(
        {"data": {"heldout_fraction": 0.5, "max_prompt_tokens": 128}, "eval": {"max_new_tokens": 8}}
    )
    a = evaluate_policy(tiny_model_dir, synth_store, recipe)
    b = evaluate_policy(tiny_model_dir, synth_store, recipe)
    assert a == b
    assert a["preference_accuracy"]["n"] > 0 and 0.0 <= a["preference_accuracy"]["value"] <= 1.0
    assert a["reward"]["n"] > 0 and set(a["reward"]["per_function"]) == set(recipe.grpo.rewards)
    assert a["hint_jsd"]["n"] > 0 and a["hint_jsd"]["value"] > 0
    worse = json.loads(json.dumps(a))
    worse["preference_accuracy"]["value"] -= 0.5
    worse["hint_jsd"]["value"] += 1.0
    v = compare(a, worse)
    assert v["preference_accuracy"]["regressed"] and v["hint_jsd"]["regressed"] and not v["reward"]["regressed"]
    assert not v["passed"] and compare(a, b)["passed"]


def test_cli_train_prints_json_lines_and_checkpoint(tiny_model_dir, synth_store, tmp_path, capsys, repo_root):
    from composer_pipeline.cli import main

    recipe = tmp_path / "r.yaml"
    text = (repo_root / "recipes" / "train.yaml").read_text()
    recipe.write_text(text.replace("max_completion_length: 32", "max_completion_length: 8"))
    rc = main(
        [
            "train",
            "--data",
            synth_store,
            "--recipe",
            str(recipe),
            "--model",
            str(tiny_model_dir),
            "--steps",
            "2",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["step"] for line in lines[:-1]] == [1, 2]
    assert all({"grpo", "sdpo", "dpo", "total", "off"} <= set(line) for line in lines[:-1])
    assert (tmp_path / "o" / "checkpoint" / "model.safetensors").is_file()
    assert lines[-1]["checkpoint"] == str(tmp_path / "o" / "checkpoint")
    rc = main(
        [
            "train",
            "eval",
            "--model",
            lines[-1]["checkpoint"],
            "--baseline",
            str(tiny_model_dir),
            "--data",
            synth_store,
            "--recipe",
            str(recipe),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and "verdict" in out and out["eval"]["model"] == lines[-1]["checkpoint"]
    rc = main(
        ["train", "eval", "--json", "--model", lines[-1]["checkpoint"], "--baseline", str(tiny_model_dir)]
        + ["--data", synth_store, "--recipe", str(recipe)]
    )
    doc = json.loads(capsys.readouterr().out)  # one JSON document
    assert rc == 0 and set(doc) >= {"model", "baseline", "comparison"}
    for side in ("model", "baseline"):
        m = doc[side]["metrics"]
        assert set(m) == {"preference_accuracy", "reward", "action_parse_rate", "hint_jsd"}
        assert all({"value", "n"} <= set(v) for v in m.values())
        parse = m["action_parse_rate"]
        assert parse["n"] > 0 and 0.0 <= parse["value"] <= 1.0
        # failures counted by reason, and they add up to the share that did not parse
        assert sum(parse["errors"].values()) == round((1 - parse["value"]) * parse["n"])
    assert doc["comparison"]["action_parse_rate"]["checked"] is True
    assert "action_parse_rate" in doc["comparison"]["line"] and doc["comparison"]["measured"] is False


def test_parse_failures_are_counted_by_reason():
    from composer_pipeline.actions import parse_failure
    from composer_pipeline.train.evaluate import parse_rate

    good = '<tool_call>\n{"arguments":{"file_path":"/a.py"},"name":"Read"}\n</tool_call>'
    texts = [
        good,
        "Done: nothing to change.",  # a text answer is an action
        '<tool_call>\n{"arguments":{"file_path":"/a.py"},"name":"Re',  # cut before its end
        '<tool_call>\n{"arguments":{"file_path":"/a.py"},"name":"Read"\n</tool_call>',  # broken JSON
        '<tool_call>\n{"arguments":{"file_path":"/a.py"}}\n</tool_call>',  # no name
        "   ",
    ]
    assert [parse_failure(t) for t in texts] == [None, None, "unterminated", "invalid_json", "no_name", "empty"]
    r = parse_rate(texts)
    assert r["n"] == 6 and r["value"] == pytest.approx(2 / 6)
    assert r["errors"] == {"empty": 1, "invalid_json": 1, "no_name": 1, "unterminated": 1}
    assert parse_rate([])["value"] is None


def _pipes_env(path, payload) -> str:
    return base64.b64encode(zlib.compress(json.dumps({"path": str(path)}).encode())).decode()


def test_pipes_entry_reports_steps_and_materialization(tiny_model_dir, synth_store, tmp_path, monkeypatch, repo_root):
    """The real dagster_pipes protocol (file context + file messages), no Dagster and no fakes."""
    from composer_pipeline.train import pipes_entry

    ctx = tmp_path / "context.json"
    msgs = tmp_path / "messages.jsonl"
    ctx.write_text(
        json.dumps(
            {
                "asset_keys": ["trained_policy"],
                "code_version_by_asset_key": None,
                "provenance_by_asset_key": None,
                "partition_key": None,
                "partition_key_range": None,
                "partition_time_window": None,
                "run_id": "r1",
                "job_name": "j",
                "retry_number": 0,
                "extras": {
                    "data_root": synth_store,
                    "recipe": str(repo_root / "recipes" / "train.yaml"),
                    "model": str(tiny_model_dir),
                    "steps": 1,
                    "out_dir": str(tmp_path / "o"),
                },
            }
        )
    )
    monkeypatch.setenv("DAGSTER_PIPES_CONTEXT", _pipes_env(ctx, None))
    monkeypatch.setenv("DAGSTER_PIPES_MESSAGES", _pipes_env(msgs, None))
    assert pipes_entry.main([]) == 0
    messages = [json.loads(line) for line in msgs.read_text().splitlines()]
    methods = [m["method"] for m in messages]
    assert methods[0] == "opened" and methods[-1] == "closed"
    logs = [m["params"]["message"] for m in messages if m["method"] == "log"]
    assert any(json.loads(x).get("step") == 1 for x in logs if x.startswith("{"))
    (mat,) = [m["params"] for m in messages if m["method"] == "report_asset_materialization"]
    md = {k: v["raw_value"] for k, v in mat["metadata"].items()}
    assert md["checkpoint"] == str(tmp_path / "o" / "checkpoint")
    assert md["first_dpo_loss"] == pytest.approx(0.693147, abs=1e-4)
    assert {"final_grpo_loss", "final_sdpo_loss", "final_dpo_loss", "final_total_loss"} <= set(md)


def test_pipes_entry_runs_without_pipes(tiny_model_dir, synth_store, tmp_path, capsys, monkeypatch):
    from composer_pipeline.train import pipes_entry

    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    assert (
        pipes_entry.main(
            [
                "--data-root",
                synth_store,
                "--model",
                str(tiny_model_dir),
                "--steps",
                "1",
                "--out-dir",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["materialization"]["steps"] == 1


def test_model_names_resolve_through_local_models(tmp_path, monkeypatch, tiny_model_dir):
    from composer_pipeline.train.modeling import resolve_model_path

    monkeypatch.setenv("COMPOSER_PIPELINE_HOME", str(tmp_path / "home"))
    p = resolve_model_path("tiny")
    assert (tmp_path / "home").as_posix() in p and (Path(p) / "model.safetensors").is_file()
    # cached: train and eval see the same base model
    assert resolve_model_path("local:tiny") == p
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)
    with pytest.raises(ValueError, match="unknown local model"):
        resolve_model_path("local:nope")
    with pytest.raises(ValueError, match="no model"):
        resolve_model_path(None)


def test_no_train_recipe_means_the_defaults(tiny_model_dir, synth_store, tmp_path):
    """pipeline.yaml naming no train recipe file gives ``recipe=None`` to the trainer and to policy_eval:
    the defaults apply, as for the ingest recipe and the schedule (it crashed on ``Path(None)`` before)."""
    from composer_pipeline.train.run import build_trainer

    assert TrainRecipe.load(None) == TrainRecipe()
    built = build_trainer(str(synth_store), None, model=str(tiny_model_dir), steps=1, out_dir=tmp_path / "out")
    assert built.trainer.args.max_steps == 1
