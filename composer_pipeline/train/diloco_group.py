"""``python -m composer_pipeline.train.diloco_group``: the process of one DiLoCo replica group, and its
torchft plumbing (the lighthouse, the group's Manager).

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
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.diloco_config import DiLoCoSection

# how long the lighthouse still counts a silent group as alive (torchft's default is 5 s): long enough
# that a group killed and restarted on the same machine heartbeats again before its peers give up on it;
# a group that is gone for good holds up one sync this long
HEARTBEAT_TIMEOUT_MS = 20_000


def lighthouse_server(d: DiLoCoSection):
    """A torchft lighthouse on this machine (any free port): quorums of ≥ 1 live group; a sync waits up to
    ``rejoin_timeout_s`` for a group that heartbeats but has not reached it yet."""
    from torchft.coordination import LighthouseServer

    return LighthouseServer(
        bind="[::]:0",
        min_replicas=1,
        join_timeout_ms=int(d.rejoin_timeout_s * 1000),
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )


class CountingManager(Manager):
    """torchft's Manager, counting the bytes each all-reduce hands to the process group."""

    allreduce_bytes = 0

    def allreduce(self, tensor, *args, **kw):
        self.allreduce_bytes += tensor.numel() * tensor.element_size()
        return super().allreduce(tensor, *args, **kw)


def make_manager(group: int, lighthouse: str, d: DiLoCoSection, *, host: str | None = None) -> CountingManager:
    """The group's torchft Manager (rank 0 of a one-process group), with its own TCPStore for the
    quorum's process-group rendezvous; heartbeats to ``lighthouse`` from here on."""
    host = host or socket.gethostname()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=d.timeout_s)
    pg = ProcessGroupNCCL(timeout=timeout) if torch.cuda.is_available() else ProcessGroupGloo(timeout=timeout)
    manager = CountingManager(
        pg=pg,
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        use_async_quorum=False,  # DiLoCo needs the quorum before each sync, not during it
        timeout=timeout,
        quorum_timeout=timedelta(seconds=max(600.0, 4 * d.rejoin_timeout_s)),
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr=host,
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{group}",
        hostname=host,
        init_sync=False,  # every group starts from the same weights (same model, same seed)
    )
    manager.tcp_store = store  # kept alive with the manager
    return manager


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
