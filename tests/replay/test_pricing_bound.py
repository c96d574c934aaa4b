"""The reservation's prompt-token estimate is a true upper bound, so a budget cannot be overrun.

Checked against real byte-level BPE tokenizers applying their chat templates: the offline tiny
model's and SmolLM2-135M-Instruct's (the demo teacher), on every rendered sample state plus prompts
that are hard for a bytes-per-token guess (CJK, emoji, long digit runs, escaped JSON).
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from composer_pipeline.render import RenderOptions, render_states
from composer_pipeline.teachers.pricing import estimate_prompt_tokens

HARD = [
    "日本語のテキストはトークンが多い。" * 40,
    "🙂🚀🔥✨" * 60,
    "".join(str(i) for i in range(800)),
    '{"a": "\\"quoted\\" \\\\ back\\\\slash"}' * 30,
    "x" * 3000,
]


def _bodies(samples_tables):
    states, messages = samples_tables
    bodies = [{"messages": r.messages, "tools": r.tools} for _, r in render_states(states, messages, RenderOptions())]
    bodies += [
        {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": h}], "tools": []} for h in HARD
    ]
    return bodies


def _template_tokens(tok, body) -> int:
    kwargs = {"tools": body["tools"]} if body["tools"] else {}
    try:
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True, **kwargs)
    # a template that cannot take tools/tool messages: count the plain text instead
    except Exception:
        text = "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in body["messages"])
        ids = tok(text)["input_ids"]
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_estimate_bounds_real_tokenizer_counts(which, samples_tables, tiny_model_dir):
    if which == "tiny":
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    else:
        from composer_pipeline.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    bodies = _bodies(samples_tables)
    assert len(bodies) == 22 + len(HARD)
    worst_ratio = 0.0
    for body in bodies:
        actual, est = _template_tokens(tok, body), estimate_prompt_tokens(body)
        assert actual <= est, (which, actual, est, str(body["messages"][-1])[:120])
        worst_ratio = max(worst_ratio, actual / est)
    assert worst_ratio > 0.2  # the bound is not vacuous either
