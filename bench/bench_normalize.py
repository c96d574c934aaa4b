"""Normalization benchmark: composer-pipeline's in-process path vs data-juicer's DefaultExecutor.

Generates N (default 10,000) DPO pairs (``tests.support.synthetic_pairs``: nested prompts,
tool-call and text completions, ~5% rejected-side-only violations, special-character junk,
~4% exact duplicates), then in the same run, on the same recipe (``recipes/normalize.yaml``):
  * fast:     ``normalize_pairs`` (data-juicer's own ops called on Python lists, one batch per op);
  * baseline: ``DefaultExecutor``, the recipe loaded the plain way (``init_configs``, JSONL in/out),
              one pass per text key (the documented fix for the stats collision; without it the
              baseline would keep rejected-side violations and the outputs could not match).
Asserts the surviving pair ids are identical (same order) and prints pairs/s and the ratio.
Both sides start with data-juicer already imported (import cost ~3 s excluded from both).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_normalize.py [--n 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from composer_pipeline.pairs.config import NormalizeRecipe  # noqa: E402
from composer_pipeline.pairs.normalize import data_juicer_guard, normalize_pairs  # noqa: E402
from tests.support.default_executor import default_executor_survivors  # noqa: E402
from tests.support.synthetic_pairs import synthetic_pairs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "normalize.yaml"))
    args = ap.parse_args()

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    pairs = synthetic_pairs(args.n, args.seed)
    with data_juicer_guard():  # warm imports for both sides
        import data_juicer.core  # noqa: F401
        import data_juicer.ops  # noqa: F401

    recipe = NormalizeRecipe.load(args.recipe)
    t0 = time.perf_counter()
    res = normalize_pairs(pairs, recipe)
    fast_s = time.perf_counter() - t0

    devnull = open(os.devnull, "w")
    with tempfile.TemporaryDirectory(prefix="bench-normalize-") as tmp:
        real_out = sys.stdout
        # data-juicer prints its config tables; keep the report readable
        sys.stdout = devnull
        try:
            t0 = time.perf_counter()
            ref = default_executor_survivors(pairs, args.recipe, tmp)
            base_s = time.perf_counter() - t0
        finally:
            sys.stdout = real_out

    ours = res.kept.column("pair_id").to_pylist()
    assert ours == ref, f"outputs differ: {len(set(ours) ^ set(ref))} pair ids"
    report = {
        "pairs": args.n,
        "kept": len(ours),
        "dropped_by_op": res.stats["dropped_by_op"],
        "fast_seconds": round(fast_s, 3),
        "fast_pairs_per_s": round(args.n / fast_s, 1),
        "default_executor_seconds": round(base_s, 3),
        "default_executor_pairs_per_s": round(args.n / base_s, 1),
        "speedup": round(base_s / fast_s, 2),
        "identical_survivors": True,
    }
    print(json.dumps(report))
    print(
        f"normalize: {report['fast_pairs_per_s']} pairs/s vs DefaultExecutor "
        f"{report['default_executor_pairs_per_s']} pairs/s -> {report['speedup']}x, same {len(ours)} survivors"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
