"""``composer-pipeline model init-tiny --out DIR``: write the offline tiny model + tokenizer.

The tiny model (see :mod:`composer_pipeline.tiny_model`) needs no model hub; tests, the CPU demo
and ``train --model DIR`` use it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("model", help="model utilities (init-tiny)")
    sub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    q = sub.add_parser("init-tiny", help="write a random-init tiny Qwen2 model + byte-level BPE tokenizer")
    q.add_argument("--out", required=True, type=Path, help="directory to write (created)")
    q.add_argument("--vocab-size", type=int, default=2048)
    q.add_argument("--hidden", type=int, default=64)
    q.add_argument("--layers", type=int, default=2)
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from composer_pipeline.tiny_model import build_tiny_model

    out = build_tiny_model(args.out, vocab_size=args.vocab_size, hidden=args.hidden, layers=args.layers, seed=args.seed)
    print(json.dumps({"model": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0
