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
  member. Two texts agree when their *content* does (:func:`same_text`): with the markup a model only
  ever reads removed (``echo_markup_tags``: ``<command-name>``, ``<local-command-stdout>``, ...),
  (1) their word-bag Dice similarity is ``>= text_similarity_threshold`` and (2) they name the same
  specifics (``text_specifics_must_match``: the same set of numbers, paths, slash commands and
  identifiers, i.e. words holding a digit, ``/``, ``_`` or an inner ``.``). So ``/run`` and
  ``/read-file`` wrapped in the same echoed markup do not agree, nor do "set PORT to 8080" and "set
  PORT to 9090".

Deliberately simplified: when an action has both text and tool calls, only the calls count (the
text is commentary); text similarity is lexical (no embeddings, no model calls).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.pairs.config import SignatureRules

_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+", re.U)
_TAG = re.compile(r"</?([A-Za-z][\w-]*)(?:\s[^<>]*)?/?>")
_TOKEN = re.compile(r"[\w./\-]+", re.U)


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


def strip_markup(text: str, tags: Sequence[str]) -> str:
    """``text`` without the ``<tag>`` / ``</tag>`` markup of ``tags`` (what is between them is kept)."""
    wanted = set(tags)
    return _TAG.sub(lambda m: " " if m.group(1) in wanted else m.group(0), text)


def markup_tags(text: str, tags: Sequence[str]) -> list[str]:
    """Which of ``tags`` appear as markup in ``text`` (sorted)."""
    wanted = set(tags)
    return sorted({m.group(1) for m in _TAG.finditer(text) if m.group(1) in wanted})


def specifics(text: str) -> frozenset[str]:
    """The specific things a text names: words holding a digit, ``/``, ``_`` or an inner ``.``
    (numbers, paths, slash commands, identifiers), lower-cased, trailing punctuation removed."""
    out = set()
    for t in _TOKEN.findall(text):
        t = t.rstrip(".-").lower()
        if t and (any(ch.isdigit() for ch in t) or "/" in t or "_" in t or "." in t):
            out.add(t)
    return frozenset(out)


def same_text(a: str, b: str, rules: SignatureRules) -> bool:
    """Whether two text answers agree (see the module docstring): their content, markup removed."""
    ca, cb = strip_markup(a, rules.echo_markup_tags), strip_markup(b, rules.echo_markup_tags)
    if rules.text_specifics_must_match and specifics(ca) != specifics(cb):
        return False
    return text_similarity(ca, cb) >= rules.text_similarity_threshold


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
    return same_text(a.text, b.text, rules)


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
            if g.signature.startswith("text:") and same_text(g.representative.text, action.text, rules):
                g.members.append(member)
                break
        else:
            groups.append(Group(text_signature(action.text), action, [member]))
    groups.sort(key=lambda g: (-len(g.members), g.signature))
    return groups
