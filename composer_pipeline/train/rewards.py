"""Verifiable rewards for the GRPO channel, computed from the data (never invented).

In:  TRL's reward-function call: ``prompts``, ``completions`` (text) and, per row, the prompt
     dataset columns built by :mod:`composer_pipeline.train.data`: ``tool_names`` (tools the agent
     had at that state), ``consensus`` (teacher-consensus Action JSON, "" where none exists),
     ``consensus_text`` (its text form).
Out: one float per completion (``None`` where a reward does not apply, which TRL ignores).

Each reward is a small named function; add your own with the same signature, register it in
:data:`REWARDS` and list its name under ``grpo.rewards`` in ``recipes/train.yaml``.

* ``valid_action``    1 if the completion parses as a non-empty Action (actions.parse_action_text).
* ``known_tool``      1 if it calls only tools the agent had, 0 if any call is unknown, 0.5 for text only.
* ``consensus_match`` 1 if it makes the same decision as the teacher consensus (pairs.signature), else 0;
                      None where there is no consensus.
* ``workspace_executes`` 1 if every file-tool call of the completion works in the workspace its state's agent
                      had seen (:mod:`composer_pipeline.workspace`: Claude Code's rules over what the trace shows),
                      0 if one fails, None where the environment cannot tell or there is no file-tool call. Reads
                      the ``workspace`` column (added by the trainer when this reward is listed).
* ``format_shaped``   dense, in [0, 1]: character-level similarity to the consensus text (or, with no
                      consensus, to the tool-call shape) plus partial credit for each piece of the
                      ``<tool_call>{json}</tool_call>`` format. Random tiny models need it: binary rewards
                      give zero-variance groups and a zero GRPO gradient.

Deliberately simplified: actions execute against the workspace the trace shows, not a sandbox;
similarity is lexical.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import orjson

from composer_pipeline.actions import Action, ActionParseError, parse_action_text
from composer_pipeline.pairs.config import SignatureRules
from composer_pipeline.pairs.signature import same_decision
from composer_pipeline.workspace.files import FILE_TOOLS, Workspace

RewardFn = Callable[..., list[float | None]]

_SHAPE = '<tool_call>\n{"arguments":{},"name":""}\n</tool_call>'


def _text(completion: Any) -> str:
    """TRL passes strings for text prompts, message lists for conversational ones."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    return str(completion)


def _parse(text: str) -> Action | None:
    try:
        action = parse_action_text(text)
    except ActionParseError:
        return None
    return None if action.is_empty else action


def valid_action(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    return [1.0 if _parse(_text(c)) is not None else 0.0 for c in completions]


def known_tool(
    prompts: list, completions: list, tool_names: list[list[str]] | None = None, **kwargs: Any
) -> list[float | None]:
    out: list[float | None] = []
    for i, c in enumerate(completions):
        action = _parse(_text(c))
        if action is None:
            out.append(0.0)
        elif not action.tool_calls:
            out.append(0.5)
        else:
            allowed = set((tool_names or [[]] * len(completions))[i] or ())
            out.append(1.0 if all(tc.name in allowed for tc in action.tool_calls) else 0.0)
    return out


def consensus_match(
    prompts: list, completions: list, consensus: list[str] | None = None, **kwargs: Any
) -> list[float | None]:
    rules = SignatureRules()
    out: list[float | None] = []
    for i, c in enumerate(completions):
        ref = (consensus or [""] * len(completions))[i]
        if not ref:
            out.append(None)
            continue
        action = _parse(_text(c))
        out.append(1.0 if action is not None and same_decision(action, Action.from_json(ref), rules) else 0.0)
    return out


def format_shaped(
    prompts: list, completions: list, consensus_text: list[str] | None = None, **kwargs: Any
) -> list[float | None]:
    out: list[float | None] = []
    for i, c in enumerate(completions):
        text = _text(c)
        target = (consensus_text or [""] * len(completions))[i] or _SHAPE
        similarity = difflib.SequenceMatcher(None, text[: 4 * len(target) + 64], target, autojunk=False).ratio()
        pieces = ("<tool_call>" in text) + ("</tool_call>" in text) + ('"name"' in text) + ('"arguments"' in text)
        out.append(0.75 * similarity + 0.25 * pieces / 4.0)
    return out


def workspace_executes(
    prompts: list, completions: list, workspace: list[str] | None = None, **kwargs: Any
) -> list[float | None]:
    if workspace is None:
        raise ValueError("workspace_executes needs the `workspace` column (listed rewards add it to the GRPO rows)")
    out: list[float | None] = []
    for c, snapshot in zip(completions, workspace):
        action = _parse(_text(c))
        calls = [tc for tc in (action.tool_calls if action else ()) if tc.name in FILE_TOOLS]
        if not calls or not snapshot:
            out.append(None)
            continue
        ws = Workspace.from_dict(orjson.loads(snapshot))
        results = [ws.execute(tc.name, dict(tc.arguments)).ok for tc in calls]
        out.append(0.0 if False in results else None if None in results else 1.0)
    return out


REWARDS: dict[str, RewardFn] = {
    "valid_action": valid_action,
    "known_tool": known_tool,
    "consensus_match": consensus_match,
    "format_shaped": format_shaped,
    "workspace_executes": workspace_executes,
}


def resolve(names: list[str]) -> list[RewardFn]:
    """Reward functions by recipe name (clear error for an unknown one)."""
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ValueError(f"unknown reward(s) {unknown}; known: {sorted(REWARDS)}")
    return [REWARDS[n] for n in names]


def tool_names_of(tools_json: str | None) -> list[str]:
    """Names from the ``tools`` column (JSON list of OpenAI function schemas)."""
    if not tools_json:
        return []
    return tool_names_in(orjson.loads(tools_json))


def tool_names_in(tools: list[Any] | None) -> list[str]:
    """Names of a list of OpenAI function schemas (a schema without a string name is left out)."""
    names = []
    for t in tools or ():
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names
