import sys

import orjson
import pyarrow as pa
import pytest

from composer_pipeline import tables
from composer_pipeline.pairs.config import NormalizeRecipe
from composer_pipeline.pairs.normalize import AutoInstallBlocked, data_juicer_guard, normalize_pairs
from tests.support.synthetic_pairs import synthetic_pairs


def _recipe(*ops, **top):
    return NormalizeRecipe.from_dict({"process": list(ops), **top})


def _with(table: pa.Table, i: int, **changes) -> pa.Table:
    rows = table.to_pylist()
    rows[i].update(changes)
    return pa.Table.from_pylist(rows, schema=tables.DPO_PAIRS)


@pytest.fixture(scope="module")
def base() -> pa.Table:
    # rows 0..39, none of them dropped by the default recipe (checked below)
    t = synthetic_pairs(400, seed=7)
    res = normalize_pairs(t, NormalizeRecipe.load(None))
    return res.kept.slice(0, 40)


def test_rejected_side_alone_violating_a_filter_is_dropped(base):
    # chosen is long: a shared text_len stat would keep it
    t = _with(base, 3, rejected_text="no")
    t = _with(t, 5, chosen_text="no")
    recipe = _recipe(
        {"text_length_filter": {"text_key": "chosen_text", "min_len": 5}},
        {"text_length_filter": {"text_key": "rejected_text", "min_len": 5}},
    )
    res = normalize_pairs(t, recipe)
    # dropped rows come back in input order
    assert res.dropped.column("pair_id").to_pylist() == [base["pair_id"][3].as_py(), base["pair_id"][5].as_py()]
    d = {r["pair_id"]: r for r in res.dropped.to_pylist()}
    r3 = d[base["pair_id"][3].as_py()]
    assert r3["drop_op"] == "text_length_filter" and r3["drop_reason"].startswith("rejected_text: text_len=2")
    assert orjson.loads(r3["drop_stats"]) == {
        "text_key": "rejected_text",
        "text_len": 2,
        "bounds": {"min_len": 5, "max_len": None},
    }
    assert d[base["pair_id"][5].as_py()]["drop_reason"].startswith("chosen_text: text_len=2")
    assert res.kept.num_rows == 38 and res.stats["dropped_by_op"] == {"text_length_filter": 2}


def test_one_bad_row_drops_only_itself(base):
    t = _with(base, 7, chosen_text=None)
    res = normalize_pairs(t, NormalizeRecipe.load(None))
    assert res.kept.num_rows == 39 and res.dropped.num_rows == 1
    row = res.dropped.to_pylist()[0]
    assert row["pair_id"] == base["pair_id"][7].as_py()
    assert row["drop_op"] == "invalid_input" and "chosen_text" in row["drop_reason"]


@pytest.fixture(scope="module")
def boom_op():
    """A user-written data-juicer filter that raises on one row (a real registered op)."""
    with data_juicer_guard():
        from data_juicer.ops.base_op import OPERATORS, Filter

        if "test_boom_filter" not in OPERATORS.modules:

            @OPERATORS.register_module("test_boom_filter")
            class BoomFilter(Filter):
                _batched_op = True

                def compute_stats_batched(self, samples):
                    for i, text in enumerate(samples[self.text_key]):
                        if "BOOM" in text:
                            raise RuntimeError("cannot score this row")
                        samples["__dj__stats__"][i]["boom_len"] = len(text)
                    return samples

                def process_batched(self, samples):
                    return [True for _ in samples["__dj__stats__"]]

    return "test_boom_filter"


def test_op_error_on_one_row_drops_only_that_row_with_reason(base, boom_op):
    t = _with(base, 11, rejected_text="this row goes BOOM")
    recipe = _recipe(
        {boom_op: {"text_key": "rejected_text"}}, {"text_length_filter": {"text_key": "rejected_text", "min_len": 1}}
    )
    res = normalize_pairs(t, recipe)
    assert res.kept.num_rows == 39
    row = res.dropped.to_pylist()[0]
    assert row["pair_id"] == base["pair_id"][11].as_py() and row["drop_op"] == boom_op
    assert "RuntimeError: cannot score this row" in row["drop_reason"]


def test_untouched_columns_round_trip_unchanged(base):
    rows = base.to_pylist()
    rows[0]["prompt"] = orjson.dumps(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "x", "function": {"name": "Read", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "x", "content": "ünïcode \u0000 \n"},
            {"role": "user", "content": [{"type": "image"}]},
        ]
    ).decode()
    rows[1]["error_after"] = orjson.dumps([{"tool_use_id": "t", "tool_name": "Bash", "content": "exit 1"}]).decode()
    rows[2]["source_lines"] = []
    t = pa.Table.from_pylist(rows, schema=tables.DPO_PAIRS)
    res = normalize_pairs(t, NormalizeRecipe.load(None))
    assert res.dropped.num_rows == 0
    assert res.kept.schema == tables.NORMALIZED_DPO_PAIRS
    assert res.kept.equals(t)  # every column, every value, same order


def test_duplicates_keep_the_first_and_name_it(base):
    rows = base.to_pylist()
    dup = dict(rows[20], pair_id="f" * 20, state_id="other_state")
    rows.append(dup)
    res = normalize_pairs(pa.Table.from_pylist(rows, schema=tables.DPO_PAIRS), NormalizeRecipe.load(None))
    (row,) = res.dropped.to_pylist()
    assert row["pair_id"] == "f" * 20 and row["drop_op"] == "document_deduplicator"
    assert orjson.loads(row["drop_stats"])["duplicate_of"] == rows[20]["pair_id"]


def test_recipe_guards():
    with pytest.raises(ValueError, match="skip_op_error"):
        NormalizeRecipe.from_dict({"skip_op_error": True, "process": [{"text_length_filter": {}}]})
    with pytest.raises(ValueError, match="not a pair column"):
        _recipe({"text_length_filter": {"text_key": "text"}})
    with pytest.raises(ValueError, match="only filters and deduplicators"):
        normalize_pairs(synthetic_pairs(3), _recipe({"whitespace_normalization_mapper": {"text_key": "chosen_text"}}))


def test_side_effects_are_contained_and_auto_install_fails_loudly(base):
    from loguru import logger

    sink = []
    hid = logger.add(sink.append, level="WARNING")
    out, err = sys.stdout, sys.stderr
    try:
        normalize_pairs(base, NormalizeRecipe.load(None))
        assert sys.stdout is out and sys.stderr is err
        # data-juicer's logger.remove() spared our handler
        assert hid in logger._core.handlers
        with data_juicer_guard():
            from data_juicer.utils.lazy_loader import LazyLoader

            lazy = LazyLoader("composer_no_such_module_xyz")
            with pytest.raises(AutoInstallBlocked, match="composer_no_such_module_xyz"):
                lazy.anything
    finally:
        logger.remove(hid)


# data-juicer's own DefaultExecutor (datasets + worker pools) as the reference
@pytest.mark.slow
def test_same_survivors_as_default_executor(tmp_path, repo_root):
    """The fast path changes speed, not results: compare with DefaultExecutor on 300 pairs."""
    from tests.support.default_executor import default_executor_survivors

    t = synthetic_pairs(300, seed=3)
    res = normalize_pairs(t, NormalizeRecipe.load(None))
    ref = default_executor_survivors(t, repo_root / "recipes" / "normalize.yaml", tmp_path)
    assert res.kept.column("pair_id").to_pylist() == ref
    assert 0 < res.dropped.num_rows < 300 and set(res.stats["dropped_by_op"]) >= {
        "text_length_filter",
        "document_deduplicator",
    }


def test_empty_table_normalizes_to_empty_tables():
    res = normalize_pairs(tables.empty("dpo_pairs"), NormalizeRecipe.load(None))
    assert res.kept.num_rows == 0 and res.dropped.schema == tables.DROPPED_PAIRS and res.stats["input"] == 0


def test_concurrent_calls_from_threads_agree(base):
    """Dagster runs assets in threads: two normalizations at once give the same result, no worker pools."""
    from concurrent.futures import ThreadPoolExecutor

    from loguru import logger

    real_remove = logger.remove
    with ThreadPoolExecutor(2) as ex:
        a, b = ex.map(lambda _: normalize_pairs(base, NormalizeRecipe.load(None)), range(2))
    assert a.kept.equals(b.kept) and a.kept.num_rows == base.num_rows
    assert logger.remove == real_remove  # patch undone


@pytest.mark.slow  # data-juicer's own DefaultExecutor
def test_plain_single_pass_default_executor_has_the_trap_we_avoid(base, tmp_path):
    """Why per-op stats matter: one plain DefaultExecutor pass keeps the rejected-side violator."""
    import yaml

    t = _with(base, 3, rejected_text="no")
    data = tmp_path / "in.jsonl"
    data.write_bytes(
        b"".join(
            orjson.dumps({"pair_id": p, "chosen_text": c, "rejected_text": r}) + b"\n"
            for p, c, r in zip(t["pair_id"].to_pylist(), t["chosen_text"].to_pylist(), t["rejected_text"].to_pylist())
        )
    )
    ops = [
        {"text_length_filter": {"text_key": "chosen_text", "min_len": 5}},
        {"text_length_filter": {"text_key": "rejected_text", "min_len": 5}},
    ]
    cfg_path = tmp_path / "recipe.yaml"
    cfg_path.write_text(yaml.safe_dump({"text_keys": "chosen_text", "skip_op_error": False, "process": ops}))
    with data_juicer_guard():
        from data_juicer.config import init_configs
        from data_juicer.core import DefaultExecutor

        cfg = init_configs(
            args=[
                "--config",
                str(cfg_path),
                "--dataset_path",
                str(data),
                "--export_path",
                str(tmp_path / "out.jsonl"),
                "--work_dir",
                str(tmp_path / "w"),
            ]
        )
        DefaultExecutor(cfg).run()
    plain = [orjson.loads(x)["pair_id"] for x in (tmp_path / "out.jsonl").read_bytes().splitlines() if x.strip()]
    ours = normalize_pairs(t, _recipe(*ops)).kept.column("pair_id").to_pylist()
    victim = base["pair_id"][3].as_py()
    assert victim in plain and victim not in ours
    assert [p for p in plain if p != victim] == ours
