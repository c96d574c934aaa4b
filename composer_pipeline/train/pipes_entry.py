"""``python -m composer_pipeline.train.pipes_entry``: the trainer as a Dagster Pipes subprocess.

In:  under ``PipesSubprocessClient``: extras ``data_root``, ``recipe`` (path), ``model``, ``steps``,
     ``out_dir``. Without a Pipes environment (plain CLI): the same values as flags
     (``--data-root --recipe --model --steps --out-dir``).
Out: one ``pipes.log.info(<json step line>)`` per step, then
     ``report_asset_materialization`` with the checkpoint path and per-channel final losses.
     Without Pipes, the step lines and the final metadata are printed as JSON.

Under ``torchrun``/``accelerate`` with N ranks, every rank trains its shard of the same model
(:mod:`composer_pipeline.train.distributed`). With ``diloco.replica_groups`` ≥ 2 in the recipe it runs the
replica groups instead (:mod:`composer_pipeline.train.diloco_launch`; the metadata gains ``replica_groups``,
``outer_steps``, ``groups_lost``, ``groups_rejoined``, ``groups_dropped``); only rank 0 opens the Pipes session (or prints), so
Dagster sees one step line per step and one materialization, with the global losses.

Only ``dagster_pipes`` (the small, dependency-free protocol package) is imported, never Dagster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from composer_pipeline.train import distributed


def _metadata(res) -> dict:
    md = {
        "checkpoint": str(res.checkpoint),
        "steps": res.metrics["steps"],
        "device": res.metrics["device"],
        "mean_step_seconds": res.metrics["mean_step_seconds"],
        "channels_off": json.dumps(res.metrics["channels_off"]),
    }
    # replica groups (composer_pipeline.train.diloco_launch)
    if "diloco" in res.metrics:
        dl = res.metrics["diloco"]
        md |= {k: dl[k] for k in ("replica_groups", "outer_steps", "groups_lost", "groups_rejoined") if k in dl}
        if "groups_dropped" in dl:
            md["groups_dropped"] = json.dumps(dl["groups_dropped"])
    for ch, v in res.metrics["final"].items():
        md[f"final_{ch}_loss"] = v if v is not None else "off"
    if res.metrics.get("ln2_check"):
        md["first_dpo_loss"] = res.metrics["ln2_check"]["first_dpo_loss"]
    return md


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, open_dagster_pipes

    from composer_pipeline.train.diloco_launch import train

    try:
        return _main(argv, distributed.current().main, DAGSTER_PIPES_CONTEXT_ENV_VAR, open_dagster_pipes, train)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _main(argv, main_rank: bool, pipes_env: str, open_dagster_pipes, train) -> int:
    if pipes_env in os.environ and not main_rank:  # ranks > 0 train their shard silently
        from dagster_pipes import PipesDefaultContextLoader, PipesEnvVarParamsLoader

        with PipesDefaultContextLoader().load_context(PipesEnvVarParamsLoader().load_context_params()) as ctx:
            # read only: rank 0's session reports for all ranks
            extras = dict(ctx["extras"])
        steps = extras.get("steps")
        train(
            extras["data_root"],
            extras["recipe"],
            model=extras.get("model"),
            steps=int(steps) if steps is not None else None,
            out_dir=Path(extras["out_dir"]),
        )
        return 0
    if pipes_env in os.environ:  # launched by PipesSubprocessClient
        with open_dagster_pipes() as pipes:
            steps = pipes.get_extra("steps")
            res = train(
                pipes.get_extra("data_root"),
                pipes.get_extra("recipe"),
                model=pipes.get_extra("model"),
                steps=int(steps) if steps is not None else None,
                out_dir=Path(pipes.get_extra("out_dir")),
                on_step=lambda rec: pipes.log.info(json.dumps(rec)),
                # DiLoCo on many hosts: one Pipes run per group
                lighthouse=pipes.extras.get("lighthouse"),
                group=pipes.extras.get("group"),
            )
            pipes.report_asset_materialization(metadata=_metadata(res))
        return 0
    p = argparse.ArgumentParser(prog="python -m composer_pipeline.train.pipes_entry")
    p.add_argument("--data-root", required=True)
    p.add_argument("--recipe", default="recipes/train.yaml")
    p.add_argument("--model", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--lighthouse", default=None, help="DiLoCo on many hosts: the lighthouse this group joins")
    p.add_argument("--group", type=int, default=None, help="DiLoCo on many hosts: this host's replica group id")
    a = p.parse_args(argv)
    say = main_rank
    res = train(
        a.data_root,
        a.recipe,
        model=a.model,
        steps=a.steps,
        out_dir=a.out_dir,
        on_step=(lambda r: print(json.dumps(r), flush=True)) if say else None,
        lighthouse=a.lighthouse,
        group=a.group,
    )
    if say:
        print(json.dumps({"materialization": _metadata(res)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
