"""The ``workspace_executes`` GRPO reward, a GRPO run where it varies within a group, and the OpenEnv
environment / TRL environment-factory tools over the same workspace."""

from __future__ import annotations

import math

import orjson
import pytest

from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.store import Store
from composer_pipeline.train.rewards import workspace_executes
from composer_pipeline.workspace.verify import workspace_snapshots

CWD = "/home/u/p"


def _completion(name: str, **args) -> str:
    return Action(tool_calls=(ToolCall(name=name, arguments=args),)).to_text()


def _snapshots(store: str) -> list[str]:
    ids = [r["state_id"] for r in Store(store).read_table("trace_states").to_pylist()]
    snaps = workspace_snapshots(store, ids)
    return [snaps[i] for i in ids]


def test_reward_is_1_0_or_none_by_the_workspace_of_the_state(file_tool_store):
    after_read = _snapshots(file_tool_store)[1]  # the state of the Edit: app.py was read
    completions = [
        _completion("Edit", file_path=f"{CWD}/app.py", old_string="b = 2", new_string="b = 3"),
        _completion("Edit", file_path=f"{CWD}/app.py", old_string="zzz", new_string="y"),
        _completion("Edit", file_path=f"{CWD}/util.py", old_string="x", new_string="y"),
        _completion("Read", file_path=f"{CWD}/never_seen.py"),
        "I would rather explain first.",
        _completion("Bash", command="ls"),
    ]
    got = workspace_executes([""] * 6, completions, workspace=[after_read] * 6)
    assert got == [1.0, 0.0, 0.0, None, None, None]
    with pytest.raises(ValueError, match="workspace"):
        workspace_executes([""], completions[:1])


def test_snapshots_need_the_ingested_tables(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace_states"):
        workspace_snapshots(str(tmp_path), ["x"])


@pytest.mark.slow
def test_grpo_run_with_the_reward_varying_within_a_group(file_tool_store, tiny_model_dir, tmp_path, monkeypatch):
    """The policy's sampling is scripted (a random tiny model never writes a tool call): each group of 4 gets
    two calls that work in any workspace (Glob) and two that fail in any (an unread file, old == new)."""
    from composer_pipeline.train.config import TrainRecipe
    from composer_pipeline.train.run import train
    from composer_pipeline.train.trainer import ThreeChannelTrainer

    texts = [
        _completion("Glob", pattern="*.py", path=CWD),
        _completion("Glob", pattern="**/*.md", path=CWD),
        _completion("Edit", file_path=f"{CWD}/unread.py", old_string="a", new_string="b"),
        _completion("Edit", file_path=f"{CWD}/app.py", old_string="a", new_string="a"),
    ]

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        eos = self.eos_token_ids[0]
        return [self.processing_class(text=texts[i % 4])["input_ids"] + [eos] for i in range(len(prompt_ids))], None

    monkeypatch.setattr(ThreeChannelTrainer, "_generate_single_turn", scripted)
    recipe = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "weights": {"grpo": 1.0, "sdpo": 0.0, "dpo": 0.0},
            "grpo": {
                "max_completion_length": 64,
                "num_generations": 4,
                "prompts_per_step": 2,
                "rewards": ["workspace_executes"],
            },
            "data": {"max_prompt_tokens": 128, "heldout_fraction": 0.0},
            "optim": {"learning_rate": 1e-3},
        }
    )
    res = train(file_tool_store, recipe, steps=2, out_dir=tmp_path)
    for rec in res.losses:
        assert rec["reward"] == pytest.approx(0.5) and rec["reward_std"] > 0.4
        assert rec["grpo"] is not None and math.isfinite(rec["grpo"])


# importing openenv costs ~6 s (gradio, fastmcp)
@pytest.mark.slow
def test_openenv_environment_reset_step_state(file_tool_store):
    from openenv.core.env_server.interfaces import Environment

    from composer_pipeline.workspace.env import WorkspaceAction, WorkspaceEnv

    env = WorkspaceEnv()
    assert isinstance(env, Environment)
    first = env.reset(workspace=_snapshots(file_tool_store)[1], episode_id="e1")
    assert "1 files known" in first.text
    ok = env.step(WorkspaceAction(tool="Edit", arguments={"file_path": f"{CWD}/app.py", "old_string": "a = 1",
                                                          "new_string": "a = 2"}))  # fmt: skip
    assert ok.ok is True and ok.reward == 1.0 and "has been updated" in ok.text
    again = env.step(WorkspaceAction(tool="Read", arguments={"file_path": f"{CWD}/app.py"}))
    # the episode goes on in the edited workspace
    assert again.text == "     1→a = 2\n     2→b = 2"
    bad = env.step(WorkspaceAction(tool="Write", arguments={"file_path": f"{CWD}/new.txt", "content": "x"}))
    assert bad.ok is None and bad.reward is None
    assert env.state.episode_id == "e1" and env.state.step_count == 3 and env.state.results == [True, True, None]
    with pytest.raises(ValueError, match="snapshot"):
        env.reset()


def test_trl_environment_factory_tools(file_tool_store):
    from transformers.utils import get_json_schema

    from composer_pipeline.workspace.env import WorkspaceTools

    tools = WorkspaceTools()
    for method in (tools.Read, tools.Write, tools.Edit, tools.Glob):  # TRL builds the tool schemas this way
        assert get_json_schema(method)["function"]["name"] == method.__name__
    assert tools.reset(workspace=_snapshots(file_tool_store)[1], prompt="p") is None
    assert "has been updated" in tools.Edit(f"{CWD}/app.py", "b = 2", "b = 5")
    assert "File has not been read yet" in tools.Edit(f"{CWD}/other.py", "q", "r")
    assert tools.Read(f"{CWD}/never_seen.py").startswith("(the environment cannot tell")
    assert tools.get_reward() == 0.5  # the undecided Read does not count
    assert orjson.loads(_snapshots(file_tool_store)[1])["cwd"] == CWD


# TRL + openenv imports and one GRPO step on the tiny model (~15 s here)
@pytest.mark.slow
def test_grpo_step_through_trl_environment_factory(file_tool_store, tiny_model_dir, tmp_path, monkeypatch):
    """TRL 1.16's own tool loop: GRPOTrainer(environment_factory=...) parses each completion's tool call with the
    tokenizer's response template, calls the OpenEnv environment's tool, and scores the rollout by its get_reward.
    The sampling is scripted (a random tiny model never writes a tool call): in each group of 4, two Edits that
    work in the state's workspace (app.py was read) and two that fail (an unread file)."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from composer_pipeline.workspace.env import WorkspaceTools, trl_environment

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"  # drops tool calls
    with pytest.raises(ValueError, match="response_template"):
        trl_environment(plain)
    factory = trl_environment(tok)
    assert factory is WorkspaceTools
    calls = [
        f'<tool_call>\n{{"arguments":{{"file_path":"{CWD}/app.py","new_string":"b = 3","old_string":"b = 2"}},'
        '"name":"Edit"}\n</tool_call>',
        f'<tool_call>\n{{"arguments":{{"file_path":"{CWD}/util.py","new_string":"y","old_string":"x"}},'
        '"name":"Edit"}\n</tool_call>',
    ]
    seen_results: list[str] = []

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        eos = self.eos_token_ids[0]
        out = []
        for i, ids in enumerate(prompt_ids):
            prompt = self.processing_class.decode(ids)
            if "<|im_start|>tool" in prompt:  # the turn after the tool's result: stop
                seen_results.append(prompt.rsplit("<|im_start|>tool", 1)[1])
                out.append([eos])
            else:
                out.append(self.processing_class(text=calls[(i // 2) % 2])["input_ids"] + [eos])
        return out, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    snapshot = _snapshots(file_tool_store)[1]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "tidy app.py"}], "workspace": snapshot}] * 2)
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
        max_completion_length=256, learning_rate=1e-3, bf16=False, use_cpu=True, report_to=[], logging_steps=1,
        save_strategy="no", dataloader_pin_memory=False,
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, environment_factory=factory)
    assert {t.__name__ for t in trainer.tools} == {"Read", "Write", "Edit", "Glob"}
    trainer.train()
    log = {k: float(v) for k, v in trainer.state.log_history[0].items()}
    assert log["reward"] == pytest.approx(0.5) and log["reward_std"] > 0.4  # varies within each group
    assert log["rewards/WorkspaceTools/mean"] == pytest.approx(0.5) and log["tools/call_frequency"] == 1.0
    assert any("has been updated" in r for r in seen_results)
    assert any("File has not been read yet" in r for r in seen_results)
    assert math.isfinite(log["loss"]) and log["grad_norm"] > 0  # the advantages are not all zero
