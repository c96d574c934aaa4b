"""The reference way: data-juicer's ``DefaultExecutor`` on the same recipe (benchmark + tests).

In:  a ``dpo_pairs`` table, the normalize recipe file, a scratch directory.
Out: the pair ids that survive, as ``DefaultExecutor`` computes them, loaded the plain way
     (``init_configs(['--config', recipe])``, JSONL dataset in, JSONL export out).

One adaptation, or its output would be wrong: the recipe is run as one ``DefaultExecutor`` pass
per text key (filters grouped by ``text_key``, cut at each deduplicator), the documented
workaround for data-juicer's stats collision between keys. Filters commute, so the survivors
equal one ordered pass with per-op stats. Deliberately slow: it is the yardstick.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import yaml

from composer_pipeline.pairs.config import NormalizeRecipe
from composer_pipeline.pairs.normalize import data_juicer_guard, pair_text_column
from composer_pipeline.settings import read_yaml


def _passes(recipe: NormalizeRecipe) -> list[list[tuple[str, dict]]]:
    passes: list[list[tuple[str, dict]]] = []
    segment: dict[str, list] = {}
    for name, args in recipe.process:
        if "deduplicator" in name:
            passes.extend(segment.values())
            segment = {}
            passes.append([(name, args)])
        else:
            segment.setdefault(args["text_key"], []).append((name, args))
    passes.extend(segment.values())
    return passes


def default_executor_survivors(pairs: pa.Table, recipe_path: str | Path, workdir: str | Path) -> list[str]:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    recipe = NormalizeRecipe.load(recipe_path)
    # data-juicer's own keys, passed through as written
    raw = read_yaml(recipe_path, "normalize recipe")
    keys = set(recipe.text_keys())
    cols = {"pair_id": pairs.column("pair_id").to_pylist()}
    for k in keys:
        cols[k] = pair_text_column(pairs) if k == "pair_text" else pairs.column(k).to_pylist()
    rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    with data_juicer_guard():
        from data_juicer.config import init_configs
        from data_juicer.core import DefaultExecutor

        for n, ops in enumerate(_passes(recipe)):
            data = workdir / f"pass{n}_in.jsonl"
            data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
            cfg_path = workdir / f"pass{n}.yaml"
            sub = {k: v for k, v in raw.items() if k != "process"}
            sub["text_keys"] = ops[0][1]["text_key"]
            sub["process"] = [{name: args} for name, args in ops]
            cfg_path.write_text(yaml.safe_dump(sub))
            out = workdir / f"pass{n}_out.jsonl"
            cfg = init_configs(
                args=[
                    "--config",
                    str(cfg_path),
                    "--dataset_path",
                    str(data),
                    "--export_path",
                    str(out),
                    "--work_dir",
                    str(workdir / f"work{n}"),
                ]
            )
            DefaultExecutor(cfg).run()
            rows = [orjson.loads(line) for line in out.read_bytes().splitlines() if line.strip()]
            rows = [{k: r[k] for k in cols} for r in rows]
    return [r["pair_id"] for r in rows]
