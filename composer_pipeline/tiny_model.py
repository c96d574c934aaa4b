"""An offline tiny causal LM + tokenizer, for tests and CPU demos (no model hub needed).

In:  an output directory (and sizes/seed).
Out: ``out_dir`` holding a randomly initialised Qwen2 model (``model.safetensors``, ``config.json``)
     and a byte-level BPE tokenizer (``tokenizer.json`` + ``chat_template.jinja``) that
     ``AutoModelForCausalLM`` / ``AutoTokenizer`` reload.

The tokenizer is trained with ``tokenizers`` on local text only: a fixed list of Python standard
library sources plus a few synthetic chat/tool-call lines, so ``<tool_call>`` JSON and code
compress well. Same machine + same arguments → byte-identical files.

Chat template: ChatML (``<|im_start|>role\\n...<|im_end|>``) that also renders ``tool`` role
messages, assistant ``tool_calls`` as ``<tool_call>\\n{json}\\n</tool_call>`` text (the form
:meth:`composer_pipeline.actions.Action.to_text` writes: compact JSON, sorted keys, or with
``action_order="name_first"`` the name before the arguments: :func:`chat_template`), an optional
``tools`` list in the system turn, and ``add_generation_prompt``.

Deliberately simplified: the model is random (it emits noise; tests only need gradients and
determinism), the vocabulary is small, and ``<tool_call>`` is ordinary text learned by BPE (not a
special token) so ``skip_special_tokens`` decoding keeps it.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from composer_pipeline.actions import ACTION_ORDERS, ActionOrder, parse_action_text

# Stdlib modules whose source forms the tokenizer corpus (sorted, fixed: deterministic).
_CORPUS_MODULES = (
    "argparse.py",
    "base64.py",
    "dataclasses.py",
    "difflib.py",
    "json/decoder.py",
    "json/encoder.py",
    "pathlib.py",
    "shutil.py",
    "subprocess.py",
    "textwrap.py",
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Synthetic agent-style lines: tool calls, tool results, errors, hints.
_SYNTHETIC = [
    '<tool_call>\n{"arguments":{"file_path":"/repo/src/app.py"},"name":"Read"}\n</tool_call>',
    '<tool_call>\n{"arguments":{"command":"pytest -x -q","description":"Run tests"},"name":"Bash"}\n</tool_call>',
    '<tool_call>\n{"arguments":{"new_string":"x = 1","old_string":"x = 0","file_path":"/repo/a.py"},"name":"Edit"}\n</tool_call>',
    '<tool_call>\n{"arguments":{"pattern":"def main","path":"/repo"},"name":"Grep"}\n</tool_call>',
    "Error: File has not been read yet. Read it first before writing to it.",
    "Exit code 1\nTraceback (most recent call last):\nModuleNotFoundError: No module named 'foo'",
    "Hint: the previous attempt failed. Read the file before editing it.",
    "<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\nFix the failing test.<|im_end|>\n"
    "<|im_start|>assistant\nI will run the tests first.<|im_end|>\n",
]

# one assistant tool call's arguments in the template (a JSON string as given, else compact and sorted)
_TEMPLATE_ARGS = (
    "{% if fn.arguments is string %}{{ fn.arguments }}"
    "{% else %}{{ fn.arguments | tojson(separators=(',', ':'), sort_keys=true) }}{% endif %}"
)
_TEMPLATE_CALL = {
    "sorted": "<tool_call>{{ '\n' }}{\"arguments\":" + _TEMPLATE_ARGS + ',"name":{{ fn.name | tojson }}}',
    "name_first": '<tool_call>{{ \'\n\' }}{"name":{{ fn.name | tojson }},"arguments":' + _TEMPLATE_ARGS + "}",
}


def chat_template(order: ActionOrder = "sorted") -> str:
    """The tiny model's chat template, its assistant tool calls in the key order ``order`` writes
    (:func:`composer_pipeline.actions.tool_call_json`)."""
    if order not in ACTION_ORDERS:
        raise ValueError(f"action order must be one of {ACTION_ORDERS}, not {order!r}")
    return CHAT_TEMPLATE.replace(_TEMPLATE_CALL["sorted"], _TEMPLATE_CALL[order])


CHAT_TEMPLATE = (
    # transformers renders with trim_blocks: a newline right after a block tag is dropped,
    # so newlines that follow a tag are written as {{ '\n' }} expressions.
    "{% for message in messages %}"
    "{% if loop.first and tools and message.role != 'system' %}"
    "<|im_start|>system{{ '\n' }}# Tools{% for t in tools %}{{ '\n' }}{{ t | tojson(sort_keys=true) }}{% endfor %}"
    "<|im_end|>{{ '\n' }}"
    "{% endif %}"
    "<|im_start|>{{ message.role }}{{ '\n' }}"
    "{% if message.content is string %}{{ message.content }}"
    "{% elif message.content %}{% for part in message.content %}"
    "{% if part is string %}{{ part }}{% elif part.text is defined %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if loop.first and tools and message.role == 'system' %}"
    "{{ '\n' }}# Tools{% for t in tools %}{{ '\n' }}{{ t | tojson(sort_keys=true) }}{% endfor %}"
    "{% endif %}"
    "{% if message.role == 'assistant' and message.tool_calls %}"
    "{% for tc in message.tool_calls %}"
    "{% set fn = tc.function if tc.function is defined else tc %}"
    "{% if not loop.first or (message.content is string and message.content | trim) %}{{ '\n' }}{% endif %}"
    + _TEMPLATE_CALL["sorted"]
    + "{{ '\n' }}</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    for rel in _CORPUS_MODULES:
        p = stdlib / rel
        if p.is_file():
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
    texts.extend(_SYNTHETIC * 20)
    return texts


# GPT-2's pre-tokenizer pattern with one change: a "/" stays with the word after it ("/session" is one
# piece, so a BPE trained on paths can make it one token).
_PATH_WORDS = r"""'s|'t|'re|'ve|'m|'ll|'d| ?/?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}/]+|/|\s+(?!\S)|\s+"""


def _synthetic(order: ActionOrder) -> list[str]:
    """The synthetic lines, their tool calls in ``order`` (the sorted ones are kept as first written)."""
    if order == "sorted":
        return _SYNTHETIC
    return [parse_action_text(t).to_text(order) if t.startswith("<tool_call>") else t for t in _SYNTHETIC]


def build_tokenizer(
    vocab_size: int = 2048,
    corpus: list[str] | None = None,
    *,
    path_words: bool = False,
    action_order: ActionOrder = "sorted",
):
    """Train the byte-level BPE and wrap it as a ``PreTrainedTokenizerFast`` (with chat template).
    ``corpus`` replaces the default stdlib text (the synthetic tool-call lines are always added).
    ``path_words``: keep a ``/`` with the word after it, so that copying a path piece from a request
    means matching one token. ``action_order``: the tool calls' key order, in the synthetic lines and
    the chat template (:func:`chat_template`)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if path_words:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PATH_WORDS), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    synthetic = _synthetic(action_order)
    tok.train_from_iterator(_corpus() if corpus is None else [*corpus, *synthetic * 20], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="left",
    )
    fast.chat_template = chat_template(action_order)
    return fast


def build_tiny_model(
    out_dir: Path,
    *,
    vocab_size: int = 2048,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    corpus: list[str] | None = None,
    path_words: bool = False,
    action_order: ActionOrder = "sorted",
) -> Path:
    """Write a random-init tiny Qwen2 causal LM + tokenizer to ``out_dir``; returns ``out_dir``.
    ``corpus``: text the tokenizer is trained on instead of the stdlib sources; ``path_words``,
    ``action_order``: see :func:`build_tokenizer`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, corpus, path_words=path_words, action_order=action_order)
    heads = max(1, hidden // 32)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
