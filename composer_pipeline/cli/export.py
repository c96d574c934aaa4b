"""``composer-pipeline export --store D --format trl|sft --out X``: pairs as a Hugging Face dataset folder.

TRL's conversational preference rows (``trl``) or SFT rows (``sft``), split train / test by the
trainer's held-out rule, with a dataset card (``composer_pipeline/export.py``). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from composer_pipeline.cli.train import DEFAULT_RECIPE


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write the pairs as a Hugging Face dataset (TRL DPO or SFT rows)")
    p.add_argument(
        "--store", default=None, help="dir or s3:// prefix with the pair tables (default $COMPOSER_STORE or .store)"
    )
    p.add_argument("--format", choices=("trl", "sft"), default="trl", help="trl: prompt/chosen/rejected; sft: messages")
    p.add_argument("--out", required=True, help="the dataset folder to write (data/*.parquet + README.md)")
    p.add_argument(
        "--train-recipe",
        default=DEFAULT_RECIPE,
        help=f"the train recipe whose data.heldout_fraction splits the rows, as `train` splits them (default {DEFAULT_RECIPE}; "
        "where it does not exist, the built-in recipe's)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from composer_pipeline.export import export_pairs
    from composer_pipeline.store import default_store
    from composer_pipeline.train.config import TrainRecipe

    default_missing = args.train_recipe == DEFAULT_RECIPE and not Path(DEFAULT_RECIPE).exists()
    recipe = TrainRecipe() if default_missing else TrainRecipe.load(args.train_recipe)
    res = export_pairs(args.store or default_store(), args.format, args.out, recipe.data.heldout_fraction)
    print(json.dumps(res.summary()))
    return 0
