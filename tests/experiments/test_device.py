"""The experiment's ``device`` setting (issue 31 item 4): ``cpu`` is what ran before the setting existed
(the same run.json fingerprint, the same fp32 model on the CPU), ``cuda`` where torch sees no CUDA
device is refused before anything is written, ``auto`` falls back to the CPU. The CUDA path itself
cannot run here (no GPU): bench/gpu/README.md says so."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from composer_pipeline.cli import build_parser
from composer_pipeline.cli.experiment import experiment_config
from composer_pipeline.experiments.read_before_edit import run_experiment
from composer_pipeline.experiments.read_before_edit.config import load_config
from composer_pipeline.train.modeling import load_policy, resolve_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour where torch sees no CUDA")

# smollm2_plan's fingerprint as the code before the device setting wrote it (computed from that commit):
# the CPU cells of runs/rbe-smol2 made before the setting must still resume
PLAN_FINGERPRINT = {
    "dpo_sft_weight": 1.0,
    "dpo_variant": "dpop",
    "eval_every": 15,
    "heldout_seed": 100,
    "heldout_sessions": 24,
    "hint_teacher": "initial",
    "learning_rate": 3e-05,
    "lora": False,
    "max_new_tokens": 72,
    "model": "local:smollm2-135m-instruct",
    "preference_tokens": "first_differing",
    "pretrain_sessions": 600,
    "pretrain_steps": 2400,
    "probe_states": "decisive",
    "prompt_tokens": 384,
    "sft_lr": 0.0001,
    "sft_steps": 40,
    "steps": 30,
    "teachers": {"noisy-1": "noisy-1", "noisy-2": "noisy-2", "rule": "rule", "rule-copy": "rule", "writer": "writer"},
    "train_sessions": 48,
    "version": 5,
}


def _fp(cfg) -> dict:
    return json.loads(json.dumps(cfg.fingerprint(), default=str))


def test_cpu_keeps_the_fingerprint_and_cuda_names_itself(tmp_path):
    cfg = load_config("smollm2_plan", tmp_path)
    assert cfg.device == "cpu"
    assert _fp(cfg) == PLAN_FINGERPRINT
    assert _fp(replace(cfg, device="cpu")) == PLAN_FINGERPRINT
    assert _fp(replace(cfg, device="cuda")) == {**PLAN_FINGERPRINT, "device": "cuda"}


def test_the_cli_flag_sets_the_device(tmp_path):
    def cli(*flags: str):
        args = build_parser().parse_args(["experiment", "read-before-edit", "--out", str(tmp_path), *flags])
        return experiment_config(args)

    assert cli("--recipe", "smollm2_plan").device == "cpu"
    assert cli("--recipe", "smollm2_plan", "--device", "cuda").device == "cuda"
    assert cli("--device", "auto").device == "auto"
    with pytest.raises(SystemExit):
        cli("--device", "gpu")


def test_resolve_device_without_cuda():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == "cpu"
    with pytest.raises(RuntimeError, match=r"device cuda asked for, but torch .* sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("gpu")


def test_cuda_is_refused_before_the_run_writes_anything(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        run_experiment(load_config("quick", out, device="cuda"), emit=lambda _: None)
    assert not out.exists(), "nothing is built or written before the device is known"


def test_auto_without_cuda_runs_as_cpu_and_resumes_cpu_cells(tmp_path):
    """auto is resolved before the fingerprint is checked: a cpu run directory accepts it, a cuda one
    refuses it (its cells were made on another device)."""
    from composer_pipeline.experiments.read_before_edit.run import _check_run_dir

    cfg = load_config("quick", tmp_path)
    _check_run_dir(tmp_path, cfg)
    _check_run_dir(tmp_path, replace(cfg, device=resolve_device("auto")))  # no error: the same settings
    with pytest.raises(ValueError, match="other settings .*device"):
        _check_run_dir(tmp_path, replace(cfg, device="cuda"))


def test_load_policy_on_cpu_is_the_default_load(tmp_path):
    """device cpu gives the model and dtype the deviceless load gave (fp32 on the CPU), weight for weight."""
    from composer_pipeline.models import resolve_model

    path = str(resolve_model("tiny"))
    _, a = load_policy(path)
    _, b = load_policy(path, "cpu")
    assert (a.device.type, a.dtype) == (b.device.type, b.dtype) == ("cpu", torch.float32)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        load_policy(path, "cuda")
