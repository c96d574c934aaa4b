"""The commands the trainer launchers build (torchrun / accelerate prefixes, commands in the k8s pod).

test_pipes_launchers.py runs the local ones for real (a Pipes training run behind each prefix).
"""

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

