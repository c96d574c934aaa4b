"""The offline tiny model: reloadable, deterministic, chat template renders tools and tool calls."""

from __future__ import annotations

from composer_pipeline.actions import Action, ToolCall, parse_action_text
from composer_pipeline.tiny_model import build_tokenizer
from composer_pipeline.train.data import render_chat_prompt


def test_tiny_model_reloads_and_template_renders_tool_messages(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert (tiny_model_dir / "model.safetensors").is_file()
    assert tok.pad_token and tok.bos_token and tok.eos_token and tok.pad_token != tok.eos_token
    assert model.config.vocab_size == len(tok)
    action = Action(text="Reading it.", tool_calls=(ToolCall("Read", {"limit": 5, "file_path": "/a.py"}, "c1"),))
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
        action.to_chat_message(),
        {"role": "tool", "tool_call_id": "c1", "content": "1: x = 0"},
    ]
    tools = [{"type": "function", "function": {"name": "Read"}}]
    # normalizes JSON-string arguments to objects
    text = render_chat_prompt(tok, msgs, tools, 10_000)
    assert "<|im_start|>tool\n1: x = 0<|im_end|>\n" in text
    assert action.to_text() in text  # the same text form actions.py writes
    assert text.endswith("<|im_start|>assistant\n")
    assert '"name": "Read"' in text.split("<|im_end|>")[0]  # tools listed in the system turn
    no_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert not no_gen.endswith("<|im_start|>assistant\n")
    # the completion text survives a tokenize/decode round trip and parses back
    ids = tok(action.to_text(), add_special_tokens=False)["input_ids"]
    assert parse_action_text(tok.decode(ids, skip_special_tokens=True)).tool_calls[0].name == "Read"


def test_tokenizer_training_is_deterministic():
    a, b = build_tokenizer(512), build_tokenizer(512)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_template_writes_history_tool_calls_as_the_completions_are_written(tiny_model_dir):
    """With ``render.action_order: name_first`` a tiny model's template (``chat_template``) renders the
    prompt's earlier tool calls in the order its completions are trained in; the default stays sorted."""
    from transformers import AutoTokenizer

    from composer_pipeline.tiny_model import CHAT_TEMPLATE, chat_template

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    action = Action(tool_calls=(ToolCall("Edit", {"old_string": "a", "file_path": "/a.py", "new_string": "b"}, "c1"),))
    msgs = [{"role": "user", "content": "fix it"}, action.to_chat_message(), {"role": "user", "content": "go on"}]
    assert chat_template("sorted") == CHAT_TEMPLATE == tok.chat_template
    for order in ("sorted", "name_first"):
        tok.chat_template = chat_template(order)
        text = render_chat_prompt(tok, msgs, [], 10_000)
        other = "name_first" if order == "sorted" else "sorted"
        assert action.to_text(order) in text and action.to_text(other) not in text
