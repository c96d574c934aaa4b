"""Model loading for training and evaluation: a model name resolved to a directory, then the
tokenizer and the causal LM on the best device (CUDA bf16, else CPU fp32) or on the device asked for
(:func:`resolve_device`); the peft ``LoraConfig`` of the recipe's ``lora`` section."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from composer_pipeline.models import KNOWN, resolve_model


def resolve_model_path(model: str | None, out_dir: Path | None = None) -> str:
    """A loadable model: ``tiny`` / ``smollm2-135m-instruct`` (also as ``local:NAME``) resolve through
    :func:`composer_pipeline.models.resolve_model` (built/converted once, cached, so
    training and evaluation see the same base model); anything else is a path or hub name as given."""
    if not model:
        raise ValueError(
            "no model: pass --model PATH (or 'tiny', 'local:smollm2-135m-instruct') or set `model:` in the recipe"
        )
    name = model.split(":", 1)[1] if model.startswith("local:") else model
    if not Path(model).is_dir():
        if name in KNOWN:
            return str(resolve_model(name))
        if model.startswith("local:"):
            raise ValueError(f"unknown local model {name!r}; known: {list(KNOWN)}")
    return model


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """``cpu`` | ``cuda`` | ``auto`` (cuda when torch sees a CUDA device, else cpu) -> ``cpu`` or ``cuda``.
    ``cuda`` where torch sees none fails here, naming the torch build, not later inside a trainer."""
    import torch

    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if device == "auto":
        return "cpu"
    raise RuntimeError(
        f"device cuda asked for, but torch {torch.__version__} sees no CUDA device "
        f"(built for CUDA: {torch.version.cuda or 'no'}): use --device cpu or --device auto"
    )


def load_policy(model_path: str, device: str | None = None):
    """Tokenizer + model. ``device`` None: the best device, CUDA in bf16 weights, else CPU fp32 (the
    trainer CLI's behaviour); ``cpu`` / ``cuda`` (resolved, :func:`resolve_device`): that device in fp32
    weights. On CUDA the trainer's bf16 autocast then computes in bf16 over fp32 master weights: bf16
    weights would round away most updates of a small learning rate (3e-5 on a weight of 0.05 is under half
    of bf16's step there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available() if device is None else resolve_device(device) == "cuda"
    bf16 = cuda and device is None
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    config = AutoConfig.from_pretrained(model_path)
    qc = getattr(config, "quantization_config", None)
    qmethod = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if qmethod == "gguf" and not any(Path(model_path).glob("*.gguf")):
        # a plain safetensors copy of a dequantized GGUF model keeps the GGUF marker in its config;
        # the weights are ordinary floats, so the model is trainable once the marker is dropped
        del config.quantization_config
    model = AutoModelForCausalLM.from_pretrained(
        model_path, config=config, dtype=torch.bfloat16 if bf16 else torch.float32
    )
    if cuda:
        # transformers declares `to` through functools.wraps(torch.nn.Module.to): mypy reads it unbound (self first)
        model = model.to("cuda")  # type: ignore[arg-type]
    return tok, model


def lora_config(lora):
    """peft's ``LoraConfig`` for the recipe's ``lora`` section (:class:`~.config.LoraSection`); None when
    LoRA is off (full fine-tuning)."""
    if not lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
