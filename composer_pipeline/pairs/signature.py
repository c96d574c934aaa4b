"""Action signatures: what makes two agent steps "the same decision".

In:  an :class:`~composer_pipeline.actions.Action` (agent step, teacher answer) and the
     :class:`SignatureRules` of ``recipes/pairs.yaml``.
Out: a short signature string, and :func:`group_actions`, which clusters several actions by it.

* Tool calls: ``tool:<Name>(<key>=<canonical value>, ...)`` for each call, over the tool's key
  arguments only (``Read`` → ``file_path``, ``Bash`` → ``command``, ...; configurable per tool;
  unlisted tools use every argument). Paths are normalised (``a/./b/`` → ``a/b``), shell commands
  have their whitespace collapsed, other values are compared as canonical JSON. Parallel calls
  are sorted, so call order does not matter (configurable).
* Text answers (no tool calls): ``text:<hash>`` of the normalised text of the cluster's first
  member; two texts agree when their word-bag Dice similarity is ``>= text_similarity_threshold``.

Deliberately simplified: when an action has both text and tool calls, only the calls count (the
text is commentary); text similarity is lexical (no embeddings, no model calls).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import orjson

from composer_pipeline.actions import Action, ToolCall

_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+", re.U)

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

    key_arguments: dict[str, list[str]] = field(default_factory=lambda: dict(DEFAULT_KEY_ARGUMENTS))
    path_arguments: tuple[str, ...] = ("file_path", "notebook_path", "path")
    command_arguments: tuple[str, ...] = ("command",)
    ignore_call_order: bool = True
    case_insensitive_tool_names: bool = False
    text_similarity_threshold: float = 0.8

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SignatureRules":
        d = dict(d or {})
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ValueError(f"signature: unknown keys {sorted(unknown)}")
        kw: dict[str, Any] = {}
        if "key_arguments" in d:
            ka = d["key_arguments"] or {}
            if not isinstance(ka, dict) or not all(isinstance(v, list) for v in ka.values()):
                raise ValueError("signature.key_arguments must map tool name -> list of argument names")
            kw["key_arguments"] = {str(k): [str(x) for x in v] for k, v in ka.items()}
        for name in ("path_arguments", "command_arguments"):
            if name in d:
                kw[name] = tuple(d[name] or ())
        for name in ("ignore_call_order", "case_insensitive_tool_names"):
            if name in d:
                kw[name] = bool(d[name])
        if "text_similarity_threshold" in d:
            t = float(d["text_similarity_threshold"])
            if not 0.0 < t <= 1.0:
                raise ValueError("signature.text_similarity_threshold must be in (0, 1]")
            kw["text_similarity_threshold"] = t
        return cls(**kw)


def canonical_path(value: str) -> str:
    p = value.strip()
    if not p:
        return p
    norm = posixpath.normpath(p.replace("\\", "/"))
    return norm


def canonical_command(value: str) -> str:
    return _WS.sub(" ", value).strip().rstrip(";").strip()


def _canonical_value(key: str, value: Any, rules: SignatureRules) -> str:
    if isinstance(value, str):
        if key in rules.path_arguments:
            return canonical_path(value)
        if key in rules.command_arguments:
            return canonical_command(value)
        return value.strip()
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def call_signature(call: ToolCall, rules: SignatureRules) -> str:
    name = call.name.lower() if rules.case_insensitive_tool_names else call.name
    keys = rules.key_arguments.get(call.name)
    if keys is None and rules.case_insensitive_tool_names:
        keys = next((v for k, v in rules.key_arguments.items() if k.lower() == call.name.lower()), None)
    if keys is None:
        keys = sorted(call.arguments)
    parts = [f"{k}={_canonical_value(k, call.arguments[k], rules)}" for k in keys if k in call.arguments]
    return f"{name}({', '.join(parts)})"


def normalize_text(text: str) -> str:
    return _WS.sub(" ", text).strip().lower()


def text_similarity(a: str, b: str) -> float:
    """Dice coefficient of the two texts' lower-cased word multisets (1.0 for two empty texts)."""
    wa, wb = Counter(_WORD.findall(a.lower())), Counter(_WORD.findall(b.lower()))
    total = sum(wa.values()) + sum(wb.values())
    if total == 0:
        return 1.0 if normalize_text(a) == normalize_text(b) else 0.0
    return 2.0 * sum((wa & wb).values()) / total


def tool_signature(action: Action, rules: SignatureRules) -> str | None:
    """The signature of the action's tool calls, or None for a text-only action."""
    if not action.tool_calls:
        return None
    sigs = [call_signature(c, rules) for c in action.tool_calls]
    if rules.ignore_call_order:
        sigs.sort()
    return "tool:" + " | ".join(sigs)


def text_signature(text: str) -> str:
    return "text:" + hashlib.sha256(normalize_text(text).encode()).hexdigest()[:16]


def action_signature(action: Action, rules: SignatureRules) -> str:
    """Signature of one action on its own (text answers: hash of the normalised text)."""
    return tool_signature(action, rules) or text_signature(action.text)


def same_decision(a: Action, b: Action, rules: SignatureRules) -> bool:
    """Whether two actions agree: equal tool signatures, or similar enough text answers."""
    sa, sb = tool_signature(a, rules), tool_signature(b, rules)
    if sa is not None or sb is not None:
        return sa == sb
    return text_similarity(a.text, b.text) >= rules.text_similarity_threshold


@dataclass
class Group:
    """Actions (by member key, e.g. teacher name) that share one decision."""

    signature: str
    representative: Action
    members: list[str] = field(default_factory=list)


def group_actions(actions: Sequence[tuple[str, Action]], rules: SignatureRules) -> list[Group]:
    """Cluster ``(member, action)`` pairs by decision; largest group first, ties by signature.

    Tool actions group by exact signature. A text answer joins the first text group whose
    representative (its first member) is similar enough, else starts a new group.
    """
    groups: list[Group] = []
    by_sig: dict[str, Group] = {}
    for member, action in actions:
        sig = tool_signature(action, rules)
        if sig is not None:
            g = by_sig.get(sig)
            if g is None:
                g = by_sig[sig] = Group(sig, action)
                groups.append(g)
            g.members.append(member)
            continue
        for g in groups:
            if g.signature.startswith("text:") and (
                text_similarity(g.representative.text, action.text) >= rules.text_similarity_threshold
            ):
                g.members.append(member)
                break
        else:
            groups.append(Group(text_signature(action.text), action, [member]))
    groups.sort(key=lambda g: (-len(g.members), g.signature))
    return groups
