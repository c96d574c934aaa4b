"""torchft's plumbing for DiLoCo replica groups: the lighthouse and one group's Manager.

In:  the recipe's :class:`~.config.DiLoCoSection`, a group id, the lighthouse address.
Out: :func:`lighthouse_server` (a torchft lighthouse on this machine) and :func:`make_manager` (the group's
     :class:`CountingManager`: torchft's Manager, heartbeating from creation, counting all-reduced bytes).

Imports torch and torchft only (no transformers/TRL), so a group process can join the lighthouse within
seconds of starting (:mod:`.diloco_group`).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.coordination import LighthouseServer

from composer_pipeline.train.config import DiLoCoSection

# how long the lighthouse still counts a silent group as alive (torchft's default is 5 s): long enough
# that a group killed and restarted on the same machine heartbeats again before its peers give up on it;
# a group that is gone for good holds up one sync this long
HEARTBEAT_TIMEOUT_MS = 20_000


def lighthouse_server(d: DiLoCoSection, min_replicas: int = 1):
    """A torchft lighthouse on this machine (any free port): quorums of ≥ ``min_replicas`` live groups (1:
    training goes on while any group lives); a sync waits up to ``rejoin_timeout_s`` for a group that
    heartbeats but has not reached it yet."""

    return LighthouseServer(
        bind="[::]:0",
        min_replicas=min_replicas,
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
        # DiLoCo needs the quorum before each sync, not during it
        use_async_quorum=False,
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
        # every group starts from the same weights (same model, same seed)
        init_sync=False,
    )
    manager.tcp_store = store  # kept alive with the manager
    return manager
