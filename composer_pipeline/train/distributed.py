"""Data-parallel training helpers: one model trained on N shards (DDP through TRL/accelerate).

In:  the process environment that ``torchrun`` / ``accelerate launch`` set (``RANK``, ``WORLD_SIZE``,
     ``LOCAL_RANK``); the process group that accelerate opens (gloo on CPU, NCCL on CUDA).
Out: the rank/world of this process, per-rank batch sizes, per-rank DPO shards, the reductions the
     trainer needs so that N ranks compute the same step as one process with the same global batch,
     and a rollout sampler whose draws do not depend on how the batch is split over ranks; and
     :func:`shard`, a DiLoCo replica group's slice of the training data.

What makes N ranks equal to one process (checked by ``tests/scaling/test_ddp_equivalence.py``):

* GRPO: TRL already gathers rewards across ranks for the group advantages, and its ``dapo`` loss
  divides by the *global* completion-token count; DDP averages the gradients. The global batch is
  ``grpo.prompts_per_step × num_generations`` rows, ``1/N`` of them per rank (:func:`per_rank_rows`).
* Rollouts: each row samples with its own generator keyed by (seed, step, global row index) through
  the Gumbel-max trick (:class:`RowGumbelSampler`), so the same row draws the same completion whether
  it sits on rank 0 of 1 or rank 1 of 2.
* SDPO: the JSD is a mean over the error-site tokens of the *global* batch: each rank's sum is divided
  by ``global_tokens / N`` (:func:`all_reduce_sum`), so the DDP average is the global mean.
* DPO: every step's ``dpo.batch_size`` pairs are split evenly over the ranks (:func:`shard_dpo_batches`);
  its NLL on the chosen answers is a global token mean the same way (:func:`share_of_global_mean`).
* Logged losses are the all-reduced global values; only rank 0 writes the checkpoint and talks Pipes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Rank:
    """Where this process sits: ``rank`` of ``world`` (1 process: rank 0 of 1)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def current() -> Rank:
    """From the launcher's environment (``torchrun``/``accelerate`` set ``RANK`` and ``WORLD_SIZE``)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"bad distributed environment: RANK={rank} WORLD_SIZE={world}")
    return Rank(rank, world)


def per_rank_rows(global_rows: int, world: int, what: str) -> int:
    """``global_rows / world``, refusing a global batch that does not split evenly."""
    if global_rows % world:
        raise ValueError(f"{what} = {global_rows} does not split over {world} ranks; make it a multiple of {world}")
    return global_rows // world


def shard(items: list[T], group: int, groups: int) -> list[T]:
    """Group ``group``'s share of ``items``: every ``groups``-th item from its index (disjoint, covering)."""
    return items[group::groups]


def shard_dpo_batches(batches: list[dict], rank: int, world: int) -> list[dict]:
    """Rank ``rank``'s share of each pre-tokenized DPO batch (rows ``[chosen_1..n, rejected_1..n]``).

    Pairs are split contiguously: rank r gets pairs ``[r·k, (r+1)·k)`` with ``k = n / world``. A batch
    whose pair count does not split (the short last one) is topped up cyclically from the batch itself
    (``pairs_per_batch_topped_up`` in the trainer's metrics says how often).
    """
    import torch

    out = []
    for b in batches:
        n = b["prompt_ids"].size(0) // 2
        if n % world:
            want = -(-n // world) * world
            idx = [i % n for i in range(want)]
            rows = torch.tensor(idx + [n + i for i in idx])
            b = {key: v[rows] for key, v in b.items()}
            n = want
        k = n // world
        rows = torch.tensor(list(range(rank * k, (rank + 1) * k)) + list(range(n + rank * k, n + (rank + 1) * k)))
        out.append({key: v[rows] for key, v in b.items()})
    return out


def share_of_global_mean(local_mean, local_tokens, global_tokens: float, world: int):
    """A rank's token mean rescaled to ``local sum / (global tokens / N)``: DDP's average of these over
    the ranks is the mean over every rank's tokens, as one process computes it over the whole batch."""
    return local_mean * local_tokens * world / global_tokens


def all_reduce_sum(values: list[float], device: Any = None) -> list[float]:
    """Sum ``values`` over all ranks (identity with one process). Every rank must call it."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.tolist()]


def union_over_ranks(items: list[str]) -> list[str]:
    """The sorted union of every rank's ``items`` (e.g. the state ids of the global batch)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sorted(set(items))
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(items))
    return sorted({x for part in gathered for x in (part or [])})


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def row_seed(seed: int, step: int, row: int) -> int:
    """A 63-bit generator seed for one rollout row of one step."""
    h = hashlib.sha256(f"{seed}|{step}|{row}".encode()).digest()
    return int.from_bytes(h[:8], "big") & ((1 << 63) - 1)


class RowGumbelSampler:
    """A ``LogitsProcessor`` that turns greedy decoding into sampling at ``temperature`` per row.

    Gumbel-max: ``argmax(logits/T + G)`` with ``G = -log(-log U)`` is an exact draw from
    ``softmax(logits/T)``. ``U`` comes from the row's own generator, so a row's completion depends on its
    key only, not on which other rows share its batch or its rank.
    """

    def __init__(self, seeds: list[int], temperature: float):
        import torch

        if temperature <= 0:
            raise ValueError(f"sampling temperature must be > 0, got {temperature}")
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature = float(temperature)

    def __call__(self, input_ids, scores):
        import torch

        v = scores.size(-1)
        u = torch.stack([torch.rand(v, generator=g, dtype=torch.float64) for g in self.generators])
        gumbel = -torch.log(-torch.log(u.clamp(1e-300, 1.0 - 1e-16)))
        return scores.double() / self.temperature + gumbel.to(scores.device)
