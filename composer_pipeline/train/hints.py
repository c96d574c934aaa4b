"""Corrective hints at error sites, for the hint self-distillation channel (channel 2).

In:  a state whose action was followed by an error (``has_error``/``error_after`` of
     ``trace_states`` or the pair tables), the agent's action, the teacher consensus where one
     exists, and the templates of ``recipes/train.yaml`` (``sdpo.hint``).
Out: a short hint string, and the prompt messages with the hint inserted as one extra message
     just before the generation point (the teacher context; the student sees the prompt without it).

Following Cursor's "targeted RL with textual feedback": the hint names what went wrong (the
error text, truncated) and, when teachers agreed on a different step, what to do instead.

Deliberately simplified: one template per case (with / without consensus), plain
``str.format`` fields; the error text is truncated, not summarised.
"""

from __future__ import annotations

from typing import Any

import orjson

from composer_pipeline.actions import Action, ActionOrder
from composer_pipeline.train.config import HintTemplates


def _clip(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def error_text(error_after: str | None) -> str:
    """Flatten ``error_after`` (JSON list of ``{tool_use_id, tool_name, content}``) to one string."""
    if not error_after:
        return ""
    items = orjson.loads(error_after)
    if not isinstance(items, list):
        raise ValueError("error_after is not a JSON list")
    parts = []
    for it in items:
        if not isinstance(it, dict):
            continue
        content = it.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
        name = it.get("tool_name") or "tool"
        parts.append(f"{name}: {content}" if content else f"{name}: error")
    return "; ".join(parts)


def build_hint(
    agent_action_json: str | None,
    error_after: str | None,
    consensus_json: str | None,
    templates: HintTemplates,
    order: ActionOrder = "sorted",
) -> str | None:
    """The hint for one error site, or None when there is no error to hint about. ``order``: the
    actions' tool-call key order in the hint's text (``render.action_order``, as the completions)."""
    err = error_text(error_after)
    if not err:
        return None
    agent = Action.from_json(agent_action_json).to_text(order) if agent_action_json else "(unknown)"
    fields = {"agent": _clip(agent, templates.max_action_chars), "error": _clip(err, templates.max_error_chars)}
    if consensus_json:
        consensus = Action.from_json(consensus_json).to_text(order)
        if consensus != Action.from_json(agent_action_json or "{}").to_text(order):
            fields["consensus"] = _clip(consensus, templates.max_action_chars)
            return templates.with_consensus.format(**fields)
    return templates.without_consensus.format(**fields)


def with_hint(messages: list[dict[str, Any]], hint: str, role: str = "user") -> list[dict[str, Any]]:
    """The teacher context: the prompt messages plus the hint as the last message."""
    return [*messages, {"role": role, "content": hint}]
