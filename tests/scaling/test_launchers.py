"""The trainer's local launchers: the commands built for torchrun / accelerate start the Pipes entry.

The commands are executed for real (with ``--help`` appended, so the entry prints its usage instead
of training): that proves torchrun's and accelerate's ``-m`` module launch reaches
``composer_pipeline.train.pipes_entry`` from this venv.
"""

import os
import subprocess
import sys

from resources.trainer import ENTRY_MODULE, TrainerLauncher, accelerate_command, torchrun_command


def test_torchrun_and_accelerate_prefixes():
    assert torchrun_command(4) == ["torchrun", "--nproc-per-node=4", "-m", ENTRY_MODULE]
    assert torchrun_command(2, python="/x/bin/python") == [
        "/x/bin/python", "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", ENTRY_MODULE]
    assert accelerate_command("/cfg/acc.yaml") == ["accelerate", "launch", "--config_file", "/cfg/acc.yaml", "-m", ENTRY_MODULE]
    assert accelerate_command(None, 2) == ["accelerate", "launch", "--num_processes", "2", "-m", ENTRY_MODULE]
    # the explicit prefix of the original resource still wins
    assert TrainerLauncher(command_prefix=["torchrun", "--nproc_per_node=2"], launcher="accelerate").command() == [
        "torchrun", "--nproc_per_node=2", "-m", ENTRY_MODULE]
    # k8s pod commands use the image's PATH, not this venv
    assert TrainerLauncher(launcher="k8s", k8s={"image": "i", "command": "accelerate", "gpus": 2}).k8s_command() == [
        "accelerate", "launch", "--num_processes", "2", "-m", ENTRY_MODULE]
    assert TrainerLauncher(launcher="k8s", k8s={"image": "i"}).k8s_command() == ["python", "-m", ENTRY_MODULE]
    spec = TrainerLauncher(launcher="k8s", k8s={"image": "i"}).k8s_pod_spec()  # CPU pod: no GPU request
    assert "resources" not in spec["containers"][0]


def _run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    return subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120, env=env)


def test_torchrun_command_launches_the_pipes_entry():
    cmd = TrainerLauncher(launcher="torchrun", nproc_per_node=1).command()
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    p = _run(cmd)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "python -m composer_pipeline.train.pipes_entry" in p.stdout and "--data-root" in p.stdout


def test_accelerate_command_launches_the_pipes_entry():
    cmd = TrainerLauncher(launcher="accelerate", nproc_per_node=1).command()
    assert cmd[0].endswith("accelerate") and cmd[1] == "launch"
    p = _run(cmd)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "python -m composer_pipeline.train.pipes_entry" in p.stdout and "--data-root" in p.stdout
