"""Model loading for training and evaluation: a model name resolved to a directory, then the
tokenizer and the causal LM on the best device (CUDA bf16, else CPU fp32); the peft ``LoraConfig``
of the recipe's ``lora`` section."""

from __future__ import annotations

from pathlib import Path

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


def load_policy(model_path: str):
    """Tokenizer + model on the best device: CUDA bf16, else CPU fp32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
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
        model_path, config=config, dtype=torch.bfloat16 if cuda else torch.float32
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
