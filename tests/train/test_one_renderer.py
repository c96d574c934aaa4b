"""One prompt renderer (issue 23): the local teacher server and the trainer turn the same state into the
same token ids, for a template that takes ``tools`` and for one that cannot (SmolLM2's), also when the
prompt is over its budget and is cut to its last tokens."""

import pytest
from test_render_plain_template import SMOLLM2_TEMPLATE, TOOLS
from transformers import AutoTokenizer

from composer_pipeline.teachers.server import LocalModel
from composer_pipeline.train.data import render_chat_prompt

STATE = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": [{"type": "text", "text": "Run the tests, then fix app.py."}]},
    {
        "role": "assistant",
        "content": "Running them.",
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "pytest -q", "timeout": 60}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "t1", "content": "1 failed: test_app.py::test_add " + "trace line " * 40},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t2", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "cat app.py"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "t2", "content": "def add(a, b):\n    return a - b"},
]


@pytest.mark.parametrize("template", ["native", "smollm2"])
@pytest.mark.parametrize("budget", [4096, 200])
def test_teacher_server_and_trainer_render_identical_token_ids(tiny_model_dir, template, budget):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if template == "smollm2":
        tok.chat_template = SMOLLM2_TEMPLATE
    else:
        assert "tools" in tok.chat_template
    max_new = 64
    server = LocalModel(name="t", path=tiny_model_dir, max_prompt_tokens=budget + max_new, tokenizer=tok)
    served = server.prompt_ids(STATE, TOOLS, max_new)
    trained = tok(render_chat_prompt(tok, STATE, TOOLS, budget), add_special_tokens=False)["input_ids"]
    assert served == trained
    full = len(tok(render_chat_prompt(tok, STATE, TOOLS, 10**6), add_special_tokens=False)["input_ids"])
    # over budget: the last `budget` tokens stayed (the start, with the system turn, went)
    if budget < full:
        assert len(served) == budget
        text = tok.decode(served)
        assert "You are a coding agent." not in text and "return a - b" in text
    assert "pytest -q" in tok.decode(trained) or budget < full
