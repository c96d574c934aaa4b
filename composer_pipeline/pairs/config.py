"""Pairs settings: ``recipes/pairs.yaml`` and ``recipes/normalize.yaml`` as typed settings dataclasses.

In:  a YAML path, a dict, or ``None`` (the packaged recipe). Out: :class:`PairRecipe` (``recipes/pairs.yaml``;
its ``signature:`` block, :class:`SignatureRules`) and :class:`NormalizeRecipe` (what the normalize stage runs,
from :class:`NormalizeFile`, ``recipes/normalize.yaml`` as written), read through :mod:`composer_pipeline.settings`.
The logic that reads them stays where it is: ``signature.py`` (action signatures), ``build.py`` (``build_pairs``),
``datajuicer.py`` / ``normalize.py`` / ``normalize_ray.py`` (the data-juicer executors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from composer_pipeline import settings, tables
from composer_pipeline.settings import setting

DEFAULT_PAIRS_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "pairs.yaml"
DEFAULT_NORMALIZE_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "normalize.yaml"
# computed by datajuicer.texts_for: prompt + chosen_text + rejected_text
DERIVED_KEYS = ("pair_text",)

# Claude Code's markup around what the user or the harness typed (slash commands, local command
# output, reminders): text a model reads in its prompt and has no reason to write
DEFAULT_ECHO_MARKUP: tuple[str, ...] = (
    "command-name",
    "command-message",
    "command-args",
    "command-contents",
    "local-command-stdout",
    "local-command-stderr",
    "local-command-caveat",
    "bash-input",
    "bash-stdout",
    "bash-stderr",
    "system-reminder",
    "user-prompt-submit-hook",
)

DEFAULT_KEY_ARGUMENTS: dict[str, list[str]] = {
    "Read": ["file_path"],
    "Write": ["file_path"],
    "Edit": ["file_path"],
    "MultiEdit": ["file_path"],
    "NotebookEdit": ["notebook_path"],
    "Glob": ["pattern", "path"],
    "Grep": ["pattern", "path"],
    "LS": ["path"],
    "Bash": ["command"],
    "WebFetch": ["url"],
    "WebSearch": ["query"],
    "Task": ["subagent_type", "description"],
    "Agent": ["subagent_type", "description"],
    "TodoWrite": [],
}


@dataclass(frozen=True)
class SignatureRules:
    """How actions are compared (the ``signature:`` block of ``recipes/pairs.yaml``)."""

    key_arguments: dict[str, list[str]] = setting(
        factory=lambda: dict(DEFAULT_KEY_ARGUMENTS),
        help="tool name -> the arguments that make a call the same decision; unlisted tools compare every argument",
    )
    path_arguments: tuple[str, ...] = setting(
        ("file_path", "notebook_path", "path"), help="arguments compared after path normalisation (a/./b/ == a/b)"
    )
    command_arguments: tuple[str, ...] = setting(("command",), help="arguments compared with whitespace collapsed")
    ignore_call_order: bool = setting(True, help="parallel calls compared as a set")
    case_insensitive_tool_names: bool = setting(False, help="compare tool names ignoring case")
    text_similarity_threshold: float = setting(
        0.8,
        help="text answers agree at word-bag Dice similarity >= this (markup of echo_markup_tags removed), in (0, 1]",
    )
    text_specifics_must_match: bool = setting(
        True,
        help="text answers agree only when they name the same numbers, paths, slash commands and identifiers "
        "(words holding a digit, '/', '_' or an inner '.')",
    )
    echo_markup_tags: tuple[str, ...] = setting(
        DEFAULT_ECHO_MARKUP,
        help="tags a model only reads in its prompt (slash commands, local command output): "
        "removed before texts are compared, and a chosen answer holding one is dropped (pairs.build)",
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.text_similarity_threshold <= 1.0:
            raise ValueError(f"text_similarity_threshold must be in (0, 1], got {self.text_similarity_threshold}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SignatureRules:
        return settings.from_dict(cls, d, "pairs recipe", "signature")


@dataclass(frozen=True)
class PairRecipe:
    """``recipes/pairs.yaml``: what counts as agreement, which answers are no vote, signature rules."""

    agreement_threshold: int = setting(
        2, help="cross_model: at least this many distinct models must share one decision"
    )
    min_agreement_score: float = setting(
        0.5,
        help="... and be at least this share of the models that answered (self_consistency: of its samples), in [0, 1]",
    )
    min_teachers: int = setting(2, help="states with fewer answered teacher entries give no row (counted in stats)")
    allow_ties: bool = setting(False, help="2-vs-2 splits: skip (false) or take the first group by signature (true)")
    allow_self_consistency: bool = setting(
        True, help="no cross-model agreement: accept samples of one model agreeing (labelled self_consistency)"
    )
    self_consistency_threshold: int = setting(2, help="... at least this many of its samples must share the decision")
    require_offered_tools: bool = setting(
        True, help="no vote: a call to a tool neither offered in the prompt nor listed under signature.key_arguments"
    )
    require_key_arguments: bool = setting(
        True, help="no vote: a call without its tool's key arguments (e.g. Bash without `command`)"
    )
    reject_prompt_echo: bool = setting(
        True,
        help="no vote: a text answer that repeats the last user message or tool result (text_similarity_threshold)",
    )
    keep_error_states: bool = setting(True, help="also pair states whose action was followed by a tool error")
    drop_parroting_chosen: bool = setting(
        True,
        help="drop (to dropped_pairs, with the reason) a pair whose chosen text holds prompt markup "
        "(signature.echo_markup_tags) or repeats a user message or tool result of its prompt (text_similarity_threshold)",
    )
    drop_repeating_chosen: bool = setting(
        True,
        help="drop (to dropped_pairs, with the reason) a pair whose chosen side repeats the last tool call of its "
        "prompt word for word (same tools, same arguments, only tool results since): it teaches repetition. Running "
        "the tests again after an edit is no such repeat (the last call is the edit)",
    )
    teacher_preference: tuple[str, ...] = setting(
        (), help="whose answer represents the consensus, first match wins (then by name)"
    )
    signature: SignatureRules = setting(factory=SignatureRules, help="what makes two actions the same decision")
    drop_fitted_answers: bool = setting(
        False,
        help="no vote: an answer to a prefix fitted into the teacher's window (messages elided or cut; teacher_replays.elided_messages/cut_messages)",
    )

    def __post_init__(self) -> None:
        for k in ("agreement_threshold", "min_teachers", "self_consistency_threshold"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if not 0.0 <= self.min_agreement_score <= 1.0:
            raise ValueError(f"min_agreement_score must be in [0, 1], got {self.min_agreement_score}")

    @property
    def min_votes(self) -> int:
        """The fewest answers any kind of consensus can come from."""
        if self.allow_self_consistency:
            return min(self.agreement_threshold, self.self_consistency_threshold)
        return self.agreement_threshold

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> PairRecipe:
        return settings.from_dict(cls, d, "pairs recipe")

    @classmethod
    def load(cls, path: str | Path | None = None) -> PairRecipe:
        """Read ``recipes/pairs.yaml`` (or ``path``); ``None`` means the packaged default."""
        p = Path(path) if path else DEFAULT_PAIRS_RECIPE
        if path is None and not p.is_file():
            return cls()
        return settings.load(cls, p, "pairs recipe")


@dataclass(frozen=True)
class NormalizeFile:
    """``recipes/normalize.yaml`` as written: a data-juicer recipe (its own key names, so the same file
    also configures data-juicer's RayExecutor); :class:`NormalizeRecipe` is what the stage runs."""

    project_name: str | None = setting(
        None, help="data-juicer's project name (kept so the file stays a data-juicer recipe; not read)"
    )
    text_keys: str | list[str] = setting(
        "chosen_text", help="default text_key of an op that names none (a list: its first)"
    )
    np: int = setting(1, help="data-juicer's worker count (not read: composer-pipeline never starts worker pools)")
    skip_op_error: bool = setting(False, help="must be false: true would let data-juicer silently drop whole batches")
    executor_type: Literal["default", "ray"] = setting(
        "default", help="default: data-juicer ops in-process; ray: data-juicer's RayExecutor (normalize_ray.py)"
    )
    ray_address: str | None = setting(
        None, help="executor_type ray: local (in-process Ray), auto (this node's cluster) or ray://head:10001"
    )
    work_dir: str | None = setting(
        None, help="executor_type ray: scratch JSONL handed to Ray (every Ray node must read it)"
    )
    process: list[Any] = setting(
        factory=list, help="ordered data-juicer ops, each {op_name: {args}} (text_key: a pair column)"
    )


@dataclass(frozen=True)
class NormalizeRecipe:
    """A data-juicer recipe: ordered ``process`` ops, each with its ``text_key``."""

    process: tuple[tuple[str, dict[str, Any]], ...]
    default_text_key: str = "chosen_text"
    path: str | None = None
    # recipe ``executor_type``: ``default`` = the in-process path below; ``ray`` = data-juicer's
    # RayExecutor (normalize_ray.py) at ``ray_address``, scratch JSONL under ``work_dir``
    executor: str = "default"
    ray_address: str | None = None
    ray_work_dir: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: str | None = None) -> NormalizeRecipe:
        f = settings.from_dict(NormalizeFile, d, path or "normalize recipe")
        if f.skip_op_error:
            raise ValueError(
                "normalize recipe: skip_op_error: true would let data-juicer silently drop whole batches; "
                "set it to false (failing rows are dropped one by one with their reason)"
            )
        tk = f.text_keys
        default_key = tk[0] if isinstance(tk, list) else str(tk)
        ops: list[tuple[str, dict[str, Any]]] = []
        for i, item in enumerate(f.process):
            if isinstance(item, str):
                item = {item: {}}
            if not isinstance(item, dict) or len(item) != 1:
                raise ValueError(f"normalize recipe: process[{i}] must be {{op_name: {{args}}}}")
            ((name, args),) = item.items()
            args = dict(args or {})
            if args.get("skip_op_error"):
                raise ValueError(f"normalize recipe: process[{i}] {name}: skip_op_error must be false")
            args.setdefault("text_key", default_key)
            ops.append((str(name), args))
        if not ops:
            raise ValueError("normalize recipe: empty process list")
        allowed = set(tables.DPO_PAIRS.names) | set(DERIVED_KEYS)
        for name, args in ops:
            if args["text_key"] not in allowed:
                raise ValueError(f"normalize recipe: {name}: text_key {args['text_key']!r} is not a pair column")
        executor = f.executor_type
        return cls(
            process=tuple(ops),
            default_text_key=default_key,
            path=path,
            executor=executor,
            ray_address=f.ray_address,
            ray_work_dir=f.work_dir if executor == "ray" else None,
        )

    @classmethod
    def load(cls, path: str | Path | None = None) -> NormalizeRecipe:
        p = Path(path) if path else DEFAULT_NORMALIZE_RECIPE
        return cls.from_dict(settings.read_yaml(p, "normalize recipe"), path=str(p))

    def text_keys(self) -> list[str]:
        return sorted({a["text_key"] for _, a in self.process})
