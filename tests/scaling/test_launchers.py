"""The commands the trainer launchers build (torchrun / accelerate prefixes, commands in the k8s pod).

test_pipes_launchers.py runs the local ones for real (a Pipes training run behind each prefix).
"""

import pytest

from resources.trainer import ENTRY_MODULE, TrainerLauncher, accelerate_command, torchrun_command


def test_torchrun_and_accelerate_prefixes():
    assert torchrun_command(4) == ["torchrun", "--nproc-per-node=4", "-m", ENTRY_MODULE]
    assert torchrun_command(2, python="/x/bin/python") == [
        "/x/bin/python",
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "-m",
        ENTRY_MODULE,
    ]
    assert accelerate_command("/cfg/acc.yaml") == [
        "accelerate",
        "launch",
        "--config_file",
        "/cfg/acc.yaml",
        "-m",
        ENTRY_MODULE,
    ]
    assert accelerate_command(None, 2) == ["accelerate", "launch", "--num_processes", "2", "-m", ENTRY_MODULE]
    # the explicit prefix of the original resource still wins
    assert TrainerLauncher(command_prefix=["torchrun", "--nproc_per_node=2"], launcher="accelerate").command() == [
        "torchrun",
        "--nproc_per_node=2",
        "-m",
        ENTRY_MODULE,
    ]
    # k8s pod commands use the image's PATH, not this venv
    assert TrainerLauncher(launcher="k8s", k8s={"image": "i", "command": "accelerate", "gpus": 2}).k8s_command() == [
        "accelerate",
        "launch",
        "--num_processes",
        "2",
        "-m",
        ENTRY_MODULE,
    ]
    assert TrainerLauncher(launcher="k8s", k8s={"image": "i"}).k8s_command() == ["python", "-m", ENTRY_MODULE]
    spec = TrainerLauncher(launcher="k8s", k8s={"image": "i"}).k8s_pod_spec()  # CPU pod: no GPU request
    assert "resources" not in spec["containers"][0]


def test_torchrun_rendezvous_flags():
    """One machine: --standalone (a free port, no clash with another job's 29500); several: the given rendezvous."""
    import sys

    local = TrainerLauncher(launcher="torchrun", nproc_per_node=2).command()
    assert local == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        ENTRY_MODULE,
    ]
    rdzv = ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--rdzv-id=nightly"]
    multi = TrainerLauncher(launcher="torchrun", nproc_per_node=4, torchrun_args=rdzv).command()
    assert multi[3:8] == [*rdzv, "--nproc-per-node=4"] and "--standalone" not in multi


def test_dpo_batches_split_evenly_over_ranks():
    import torch

    from composer_pipeline.train.distributed import per_rank_rows, shard_dpo_batches

    # rows [chosen_0..n-1, rejected_0..n-1]; the id says which pair and side
    def batch(n):
        ids = torch.tensor([[i] for i in range(n)] + [[100 + i] for i in range(n)])
        return {
            "prompt_ids": ids,
            "prompt_mask": torch.ones_like(ids),
            "completion_ids": ids,
            "completion_mask": torch.ones_like(ids),
        }

    full, short = batch(4), batch(3)
    r0, r1 = (shard_dpo_batches([full, short], r, 2) for r in (0, 1))
    assert r0[0]["prompt_ids"].flatten().tolist() == [0, 1, 100, 101]
    assert r1[0]["prompt_ids"].flatten().tolist() == [2, 3, 102, 103]
    # the short batch is topped up cyclically
    assert r0[1]["prompt_ids"].flatten().tolist() == [0, 1, 100, 101]
    assert r1[1]["prompt_ids"].flatten().tolist() == [2, 0, 102, 100]
    assert per_rank_rows(8, 2, "x") == 4
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        per_rank_rows(8, 3, "grpo batch")
