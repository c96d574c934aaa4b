"""``executor_type: ray`` in the normalize recipe: data-juicer's RayExecutor with the same ops.

One test builds the RayExecutor config with data-juicer's own parser; the other runs a small
normalization on an in-process Ray (``ray_address: local``, no cluster) and compares it with the
default in-process path: same surviving pairs, same drops attributed to the same ops.
"""

import dataclasses

import pytest

from composer_pipeline.pairs.config import NormalizeRecipe
from composer_pipeline.pairs.normalize import data_juicer_guard, normalize_pairs
from composer_pipeline.pairs.normalize_ray import load_ray_config, ray_executor_config, ray_process
from tests.support.synthetic_pairs import synthetic_pairs

pytestmark = pytest.mark.slow  # starts a local Ray cluster


def _small_recipe(**top) -> NormalizeRecipe:
    """Three of the default recipe's ops: a filter on each side and the pair-level dedup."""
    full = NormalizeRecipe.load(None)
    keep = [(n, a) for n, a in full.process if n in ("text_length_filter", "document_deduplicator")]
    assert [n for n, _ in keep] == ["text_length_filter", "text_length_filter", "document_deduplicator"]
    return dataclasses.replace(full, process=tuple(keep), **top)


def test_bad_executor_name_is_refused():
    with pytest.raises(ValueError, match=r"executor_type must be one of \['default', 'ray'\], got 'spark'"):
        NormalizeRecipe.from_dict({"executor_type": "spark", "process": [{"text_length_filter": {"min_len": 1}}]})


def test_ray_local_matches_default_executor():
    pairs = synthetic_pairs(60, seed=3)
    ref = normalize_pairs(pairs, _small_recipe())
    res = normalize_pairs(pairs, _small_recipe(executor="ray", ray_address="local"))
    assert res.stats["executor"] == "ray"
    # the data exercises both filters' and the dedup's drops
    assert ref.dropped.num_rows > 0
    assert res.kept.column("pair_id").to_pylist() == ref.kept.column("pair_id").to_pylist()
    # untouched columns come back byte for byte (joined by row, not via Ray)
    assert res.kept.equals(ref.kept)
    assert sorted(zip(res.dropped["pair_id"].to_pylist(), res.dropped["drop_op"].to_pylist())) == sorted(
        zip(ref.dropped["pair_id"].to_pylist(), ref.dropped["drop_op"].to_pylist())
    )
    assert res.stats["dropped_by_op"] == ref.stats["dropped_by_op"]


def test_ray_recipe_builds_a_ray_executor_config(tmp_path, repo_root):
    """After the local run (module order): data-juicer's parser initializes Ray for a ray config, so the
    shipped cluster address is swapped for ``local`` (a ``ray://`` address would wait for that cluster)."""
    shipped = NormalizeRecipe.load(repo_root / "recipes" / "normalize_ray.yaml")
    assert shipped.executor == "ray" and shipped.ray_address == "ray://composer-ray-head:10001"
    recipe = dataclasses.replace(shipped, ray_address="local")
    process = ray_process(recipe)
    names = [next(iter(op)) for op in process]
    assert "document_deduplicator" not in names and names[-1] == "ray_document_deduplicator"
    assert all(next(iter(op.values()))["skip_op_error"] is False for op in process)
    conf = ray_executor_config(
        recipe, dataset_path=str(tmp_path / "in.jsonl"), export_path=str(tmp_path / "out"), work_dir=str(tmp_path / "w")
    )
    with data_juicer_guard():
        cfg = load_ray_config(conf, tmp_path / "ray.yaml")
    assert cfg.executor_type == "ray" and cfg.ray_address == "local"
    assert [next(iter(op)) for op in cfg.process] == names
    assert cfg.skip_op_error is False
