"""``render.action_order``: one text form of a tool call for the pairs, ``show`` and the trainer.

``sorted`` (the default) writes ``{"arguments":{...},"name":"Read"}``, the decision last;
``name_first`` writes ``{"name":"Read","arguments":{...}}``. Parsing reads both.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from composer_pipeline.actions import Action, ToolCall, parse_action_text, tool_call_json
from composer_pipeline.pairs.build import build_pairs
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.render import RenderOptions
from composer_pipeline.show import format_view
from composer_pipeline.show.views import pair_views
from composer_pipeline.store import Store
from composer_pipeline.train.config import HintTemplates
from composer_pipeline.train.data import grpo_records, load_train_data

from .conftest import BASH

EDIT = Action(
    text="Fixing it.",
    tool_calls=(ToolCall("Edit", {"old_string": "x = 1", "file_path": "/a.py", "new_string": "x = 2"}, "c1"),),
)


def test_each_order_renders_its_own_text():
    assert EDIT.to_text() == (
        'Fixing it.\n<tool_call>\n{"arguments":{"file_path":"/a.py","new_string":"x = 2","old_string":"x = 1"},'
        '"name":"Edit"}\n</tool_call>'
    )
    assert EDIT.to_text("name_first") == (
        'Fixing it.\n<tool_call>\n{"name":"Edit","arguments":{"file_path":"/a.py","new_string":"x = 2",'
        '"old_string":"x = 1"}}\n</tool_call>'
    )
    # sorted is the text every stored pair has had: orjson's sorted keys, nested keys too
    nested = {"b": {"z": 1, "a": [{"y": 2, "x": 1}]}, "a": "é"}
    assert (
        tool_call_json("T", nested)
        == orjson.dumps({"name": "T", "arguments": nested}, option=orjson.OPT_SORT_KEYS).decode()
    )
    assert (
        tool_call_json("T", nested, "name_first")
        == '{"name":"T","arguments":{"a":"é","b":{"a":[{"x":1,"y":2}],"z":1}}}'
    )
    with pytest.raises(ValueError, match="action order"):
        EDIT.to_text("alphabetical")  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["sorted", "name_first"])
def test_both_orders_parse_back(order):
    two = Action(text="Two steps.", tool_calls=(*EDIT.tool_calls, *BASH.tool_calls))
    back = parse_action_text(two.to_text(order))
    assert back.text == two.text
    assert [(c.name, c.arguments) for c in back.tool_calls] == [(c.name, c.arguments) for c in two.tool_calls]
    # the other order's text and a model's spaced Hermes form parse to the same calls
    spaced = '<tool_call>\n{"name": "Edit", "arguments": {"file_path": "/a.py", "new_string": "x = 2", "old_string": "x = 1"}}\n</tool_call>'
    assert parse_action_text(spaced).tool_calls[0].arguments == EDIT.tool_calls[0].arguments


def test_the_setting_is_read_and_checked():
    assert RenderOptions().action_order == "sorted"
    assert RenderOptions.from_recipe({"action_order": "name_first"}).action_order == "name_first"
    with pytest.raises(ValueError, match="action_order must be one of"):
        RenderOptions.from_recipe({"action_order": "name_last"})


def _pairs(session_tables, order: str):
    t = session_tables
    return build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(action_order=order),
    )


def _store(tmp_path, pairs) -> str:
    """The pairs as the trainer reads them, each with an error after it (so that its hint is written)."""
    table = pairs.pairs
    error = orjson.dumps([{"tool_name": "Bash", "content": "Exit code 1"}]).decode()
    table = table.set_column(
        table.schema.get_field_index("error_after"), "error_after", pa.array([error] * table.num_rows, pa.string())
    )
    Store(str(tmp_path)).write_table("normalized_dpo_pairs", table)
    Store(str(tmp_path)).write_table("agreement_positives", pairs.positives)
    return str(tmp_path)


def test_pairs_show_and_trainer_use_one_text(session_tables, tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    res = _pairs(session_tables, "name_first")
    (p,) = res.pairs.to_pylist()
    chosen, rejected = Action.from_json(p["chosen"]), Action.from_json(p["rejected"])
    assert p["chosen_text"] == chosen.to_text("name_first") and p["chosen_text"].startswith(
        '<tool_call>\n{"name":"Edit"'
    )
    assert (
        p["rejected_text"]
        == rejected.to_text("name_first")
        == '<tool_call>\n{"name":"Bash","arguments":{"command":"pytest -q"}}\n</tool_call>'
    )

    # the trainer, with a render recipe of the same order: the DPO texts are the pairs', and its own texts
    # (the GRPO target, the hint's actions) are written the same way
    recipe = tmp_path / "ingest.yaml"
    recipe.write_text("render:\n  action_order: name_first\n")
    root = _store(tmp_path / "store", res)
    data = load_train_data(root, heldout_fraction=0.0, hints=HintTemplates(), render_recipe=str(recipe))
    assert data.action_order == "name_first"
    (pair,) = data.pairs
    assert (pair.chosen_text, pair.rejected_text) == (p["chosen_text"], p["rejected_text"])
    row = next(r for r in data.prompts if r.state_id == p["state_id"])
    # the hint names both actions (newlines flattened) in the same order
    assert row.hint is not None
    for c in (*chosen.tool_calls, *rejected.tool_calls):
        assert tool_call_json(c.name, c.arguments, "name_first") in row.hint

    recs = grpo_records(AutoTokenizer.from_pretrained(tiny_model_dir), [row], 10_000, "user", data.action_order)
    assert recs[0]["consensus_text"] == p["chosen_text"]

    # show, with the same render options, shows those texts and says they are in its order
    (view,) = pair_views(
        res.pairs,
        session_tables["trace_states"],
        session_tables["trace_messages"],
        opts=RenderOptions(action_order="name_first"),
    )
    assert view.texts_match_order is True
    assert (view.agreement["chosen_text"], view.agreement["rejected_text"]) == (p["chosen_text"], p["rejected_text"])
    assert "NOT in this render.action_order" not in format_view(view, width=140)


def test_pairs_of_another_order_are_refused_by_the_trainer_and_flagged_by_show(session_tables, tmp_path):
    res = _pairs(session_tables, "sorted")
    root = _store(tmp_path / "store", res)
    recipe = tmp_path / "ingest.yaml"
    recipe.write_text("render:\n  action_order: name_first\n")
    with pytest.raises(ValueError, match="action_order 'sorted'.*'name_first'"):
        load_train_data(root, heldout_fraction=0.0, hints=HintTemplates(), render_recipe=str(recipe))
    # the default reads them as before
    assert len(load_train_data(root, heldout_fraction=0.0, hints=HintTemplates()).pairs) == 1
    (view,) = pair_views(
        res.pairs,
        session_tables["trace_states"],
        session_tables["trace_messages"],
        opts=RenderOptions(action_order="name_first"),
    )
    assert view.texts_match_order is False
    assert "NOT in this render.action_order" in format_view(view, width=140)
