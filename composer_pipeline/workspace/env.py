"""The workspace environment behind OpenEnv's interface, and as TRL ``environment_factory`` tools.

In:  a workspace snapshot (``Workspace.to_dict``, JSON or dict: the ``workspace`` column of the GRPO rows,
     or :func:`.verify.workspace_snapshots`), through ``reset``.
Out: :class:`WorkspaceEnv` — an ``openenv.core.env_server.interfaces.Environment``: ``reset(workspace=...)``
     -> :class:`WorkspaceObservation`; ``step(WorkspaceAction(tool, arguments))`` -> the tool's result in its
     own words, ``ok`` (None: cannot tell) and ``reward`` 1.0 / 0.0 / None; ``state`` -> :class:`WorkspaceState`.
     Steps go on in the same workspace (a predicted success is applied), so an episode can have many.
     :class:`WorkspaceTools` — the same environment for TRL's ``GRPOTrainer(environment_factory=...)`` (its
     public methods are the tools, each a ``step``; ``reset(**row)`` reads the row's ``workspace``; ``get_reward``
     the share of calls that worked); :func:`trl_environment` gives TRL the tokenizer's tool-call parser with it.
     TRL's tool loop needs conversational prompts (message lists); the three-channel trainer renders its
     prompts to text, so it does not run this loop (its ``workspace_executes`` reward scores the one call).

Deliberately simplified: no process, no real files: the environment executes against what the trace shows
(:mod:`.files`), so "cannot tell" is an answer; an episode ends only when the caller stops.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from composer_pipeline.workspace.files import Outcome, Workspace


class WorkspaceAction(Action):
    tool: str = Field(description="a Claude Code file tool: Read, Edit, MultiEdit, Write, Glob, Grep, LS, NotebookEdit")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's input, as Claude Code takes it")


class WorkspaceObservation(Observation):
    text: str = Field(default="", description="the tool's result in its own words ('' where not known)")
    ok: bool | None = Field(default=None, description="the call worked / failed; None: the trace cannot tell")
    reason: str = Field(default="", description="why the environment decided so")


class WorkspaceState(State):
    files_known: int = 0
    results: list[bool | None] = Field(default_factory=list)


def _load(workspace: Any) -> Workspace:
    if isinstance(workspace, Workspace):
        return workspace
    if isinstance(workspace, (str, bytes)) and workspace:
        workspace = orjson.loads(workspace)
    if not isinstance(workspace, dict):
        raise ValueError("reset needs workspace=<a Workspace snapshot (dict or JSON)>")
    return Workspace.from_dict(workspace)


def _reward(ok: bool | None) -> float | None:
    return None if ok is None else float(ok)


class WorkspaceEnv(Environment[WorkspaceAction, WorkspaceObservation, WorkspaceState]):
    """OpenEnv environment over one trace state's workspace."""

    # each instance holds its own workspace, nothing shared
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._ws = Workspace()
        self._state = WorkspaceState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> WorkspaceObservation:
        self._ws = _load(kwargs.get("workspace"))
        self._state = WorkspaceState(episode_id=episode_id or uuid.uuid4().hex, files_known=len(self._ws.files))
        return WorkspaceObservation(text=f"workspace at {self._ws.cwd}: {len(self._ws.files)} files known")

    def step(self, action: WorkspaceAction, timeout_s: float | None = None, **kwargs: Any) -> WorkspaceObservation:
        out: Outcome = self._ws.execute(action.tool, dict(action.arguments))
        self._state.step_count += 1
        self._state.results.append(out.ok)
        self._state.files_known = len(self._ws.files)
        return WorkspaceObservation(text=out.observation, ok=out.ok, reason=out.reason, reward=_reward(out.ok))

    @property
    def state(self) -> WorkspaceState:
        return self._state


class WorkspaceTools:
    """TRL ``environment_factory`` form of :class:`WorkspaceEnv`: one instance per rollout, its public methods
    are the tools (each one ``WorkspaceEnv.step``), ``reset(**row)`` resets the environment to the row's
    ``workspace``, ``get_reward`` is the share of the rollout's decided calls that worked."""

    def __init__(self) -> None:
        self.env = WorkspaceEnv()

    def reset(self, **row: Any) -> str | None:
        self.env.reset(workspace=row.get("workspace"))
        return None

    def _run(self, tool: str, arguments: dict[str, Any]) -> str:
        args = {k: v for k, v in arguments.items() if v is not None}
        out = self.env.step(WorkspaceAction(tool=tool, arguments=args))
        if out.ok is None:
            return f"(the environment cannot tell: {out.reason})"
        return out.text or f"(the call works; its output is not known here: {out.reason})"

    def Read(self, file_path: str, offset: int | None = None, limit: int | None = None) -> str:  # noqa: N802
        """Read a file.

        Args:
            file_path: absolute path of the file
            offset: first line to read (1-based)
            limit: number of lines to read
        """
        return self._run("Read", {"file_path": file_path, "offset": offset, "limit": limit})

    def Write(self, file_path: str, content: str) -> str:  # noqa: N802
        """Write a file (an existing file must have been read first).

        Args:
            file_path: absolute path of the file
            content: the whole new content
        """
        return self._run("Write", {"file_path": file_path, "content": content})

    def Edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:  # noqa: N802
        """Replace text in a file that was read first.

        Args:
            file_path: absolute path of the file
            old_string: the exact text to replace (must occur once unless replace_all)
            new_string: the replacement
            replace_all: replace every occurrence
        """
        args = {"file_path": file_path, "old_string": old_string, "new_string": new_string, "replace_all": replace_all}
        return self._run("Edit", args)

    def Glob(self, pattern: str, path: str | None = None) -> str:  # noqa: N802
        """List files matching a glob pattern.

        Args:
            pattern: glob pattern, e.g. **/*.py
            path: directory to search in
        """
        return self._run("Glob", {"pattern": pattern, "path": path})

    def get_reward(self) -> float | None:
        """The share of this rollout's calls that worked (None when none could be decided)."""
        decided = [r for r in self.env.state.results if r is not None]
        return sum(decided) / len(decided) if decided else None


def trl_environment(tokenizer: Any) -> type[WorkspaceTools]:
    """``GRPOTrainer(environment_factory=trl_environment(tokenizer))``: TRL (1.16) parses each completion's tool
    calls with the tokenizer's response template, which it knows only for the chat templates it ships; the
    house templates (``tiny_model.CHAT_TEMPLATE``, Qwen's) write Qwen's ``<tool_call>`` JSON after
    ``<|im_start|>assistant``, so TRL's ``qwen3_template`` reads them. A tokenizer whose template writes tool
    calls some other way is refused rather than parsed wrong. Returns the factory (the class)."""
    # trl costs seconds to import: only where training
    from trl.chat_template_utils import qwen3_template

    if getattr(tokenizer, "response_template", None) is None:
        probe = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "Read", "arguments": {"file_path": "/x"}}}]},
        ]  # fmt: skip
        text = tokenizer.apply_chat_template(probe, tokenize=False)
        if "<|im_start|>assistant\n<tool_call>\n{" not in text or '"name":' not in text:
            raise ValueError(
                "the tokenizer's chat template does not write Qwen-style <tool_call> JSON: set its "
                "response_template for TRL's tool parsing"
            )
        tokenizer.response_template = qwen3_template
    return WorkspaceTools
