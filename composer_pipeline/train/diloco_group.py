"""``python -m composer_pipeline.train.diloco_group``: the process of one DiLoCo replica group.

In:  ``--data --recipe --out --group --lighthouse`` (``--must-heal`` for a restart, ``--host``).
Out: the group's step lines and a final ``{"done": ...}`` line as JSON on stdout (:mod:`.diloco_launch`
     reads them); the checkpoint under ``--out/checkpoint``.

The Manager is created (and heartbeats to the lighthouse) before transformers and TRL are imported,
within seconds of a restart: while the lighthouse still hears a group, the others' next sync waits for it
(up to ``diloco.rejoin_timeout_s``), so a restarted group rejoins at the next outer step instead of after
the others have moved on without it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.diloco_manager import make_manager


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    p = argparse.ArgumentParser(prog="python -m composer_pipeline.train.diloco_group")
    p.add_argument("--data", required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--group", required=True, type=int)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--host", default=None, help="address peers reach this group at (default: the hostname)")
    p.add_argument("--must-heal", action="store_true", help="a restart: the first sync must heal from a peer")
    a = p.parse_args(argv)
    recipe = TrainRecipe.load(a.recipe)
    manager = make_manager(a.group, a.lighthouse, recipe.diloco, host=a.host)  # heartbeating from here on

    from composer_pipeline.train.diloco import train_group  # transformers, TRL: seconds

    run = train_group(
        a.data,
        recipe,
        group=a.group,
        lighthouse=a.lighthouse,
        out_dir=a.out,
        model=a.model,
        steps=a.steps,
        on_step=lambda rec: print(json.dumps(rec), flush=True),
        must_heal=a.must_heal,
        manager=manager,
    )
    done = {
        "group": a.group,
        "outer_steps": run.outer_steps,
        "healed": run.healed,
        "checkpoint": str(run.result.checkpoint),
    }
    print(json.dumps({"done": done, "allreduce_bytes": run.allreduce_bytes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
