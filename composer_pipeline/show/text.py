"""The terminal view ``composer-pipeline show`` prints (without ``--json``).

In:  a :class:`~.views.StateView` or :class:`~.views.PairView`; the width; ``full`` (nothing shortened).
Out: :func:`format_view` -> text: a header, the prefix messages (:func:`.walk.walk`), the agent's action,
     the error that followed, each teacher's answer; for a pair, chosen | rejected side by side first.

Deliberately simplified: plain text with box-drawing rules, no colour; stored text is printed as is
(the CLI escapes control characters: :func:`composer_pipeline.cli.terminal.safe`).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from itertools import zip_longest

from composer_pipeline.pairs.build import agreement_label
from composer_pipeline.show.views import PairView, StateView, View
from composer_pipeline.show.walk import (
    action_lines,
    limits,
    lines_span,
    money,
    secs,
    shorten,
    teacher_flags,
    teacher_summary,
    walk,
)


def format_view(view: View, *, width: int | None = None, full: bool = False) -> str:
    """The readable terminal view (``show`` without ``--json``); ``full`` = nothing shortened."""
    width = width or max(80, min(shutil.get_terminal_size((120, 40)).columns, 200))
    if isinstance(view, PairView):
        return _format_pair(view, width, full)
    return _format_state(view, width, full)


def _indent(lines: Sequence[str] | str, n: int = 4) -> str:
    if isinstance(lines, str):
        lines = lines.splitlines() or [""]
    return "\n".join(" " * n + ln for ln in lines)


def _format_state(v: StateView, width: int, full: bool, agreeing: Sequence[str] = ()) -> str:
    lim = limits(full)
    m = v.meta
    out = [f"━━ state {v.state_id} " + "━" * max(0, width - 10 - len(v.state_id))]
    out.append(
        f"stream   {m.get('stream_id')} ({m.get('stream_kind')})"
        + (f" agent {m['agent_id']}" if m.get("agent_id") else "")
    )
    out.append(f"source   {v.source_file}  {lines_span(v.source_lines)}")
    bits = [b for b in (m.get("model"), m.get("version") and f"v{m['version']}", m.get("timestamp")) if b]
    if bits:
        out.append(f"agent    {' · '.join(bits)}")
    tool_names = [t.get("function", {}).get("name") for t in v.tools]
    render = ", ".join(f"{k}={val}" for k, val in v.render.items())
    out.append(f"prefix   {len(v.prefix)} messages · {render} · tools offered: {', '.join(tool_names) or 'none'}")
    for miss in v.missing:
        out.append(f"missing  {miss}")
    out.append("")
    out.append("── what the agent saw (the messages teachers are sent) " + "─" * max(0, width - 55))
    for t in walk(v.prefix, full):
        out.extend(_prefix_message_lines(t))
    out.append("")
    out.append("── what the agent did " + "─" * max(0, width - 22))
    out.append(_indent(action_lines(v.action, lim.value_chars, lim.text_lines)))
    if v.error_after:
        out.append("── the error that followed " + "─" * max(0, width - 27))
        for e in v.error_after:
            out.append(f"    {e.get('tool_name')} {e.get('tool_use_id')}:")
            out.append(_indent(shorten(str(e.get("content") or ""), lim.tool_lines), 6))
    out.append("── teachers " + "─" * max(0, width - 12))
    out.extend(_teacher_lines(v, lim, agreeing))
    return "\n".join(out)


def _prefix_message_lines(t) -> list[str]:
    """One message of the prefix the teachers were sent: its header line and its indented body."""
    if t.role == "tool":
        head = f"[{t.index}] tool ← {t.tool_name} {t.tool_call_id}"
        if t.interrupted:
            return [f"{head}  INTERRUPTED (no result before this step)"]
        return [head, _indent(t.body)]
    if t.role == "assistant":
        return [f"[{t.index}] assistant", _indent(t.lines or ["(empty)"])]
    return [f"[{t.index}] {t.role}", _indent(t.body)]


def _teacher_lines(v: StateView, lim, agreeing: Sequence[str]) -> list[str]:
    """The teachers' section of a state: a summary, then each teacher's row, reason and answer."""
    if not v.teachers:
        return ["    not replayed yet" if not v.replayed else "    (no rows)"]
    out = [f"    {teacher_summary(v.teachers)}"]
    for t in v.teachers:
        out.extend(_one_teacher_lines(t, lim, agreeing))
    return out


def _one_teacher_lines(t, lim, agreeing: Sequence[str]) -> list[str]:
    prompt = t.prompt_tokens if t.prompt_tokens is not None else "?"
    completion = t.completion_tokens if t.completion_tokens is not None else "?"
    tok = f"{prompt}+{completion} tok"
    if t.cached_tokens:
        tok += f" ({t.cached_tokens} cached)"
    out = [
        f"  {t.teacher} ({t.model})  {t.status}  cost {money(t.cost_usd)} paid {money(t.paid_usd)}  {secs(t.latency_s)}  {tok}  "
        f"attempts {t.attempts}{teacher_flags(t, agreeing)}"
    ]
    if t.elided_messages:
        out.append(
            f"      fitted: {t.elided_messages} messages elided before this point (the teacher's context window)"
        )
    if t.reason:
        out.append(f"      reason: {t.reason}")
    if t.action:
        out.append(_indent(action_lines(t.action, lim.value_chars, lim.text_lines), 6))
    elif t.raw_answer:
        out.append(
            _indent(["raw answer (not parsed as an action):", *shorten(t.raw_answer, lim.text_lines).splitlines()], 6)
        )
    return out


def _column(action: dict, width: int, full: bool) -> list[str]:
    lines = []
    for ln in action_lines(action, 0 if full else 400, 0 if full else 20):
        lines += textwrap.wrap(ln, width, replace_whitespace=False, drop_whitespace=False) or [""]
    return lines


def _format_pair(p: PairView, width: int, full: bool) -> str:
    a = p.agreement
    agreeing = a.get("agreeing_teachers") or []
    head = [
        f"━━ pair {p.pair_id} ({p.pair_kind}) " + "━" * max(0, width - 12 - len(p.pair_id) - len(p.pair_kind or ""))
    ]
    head.append(
        "tables   "
        + "; ".join(
            f"{t['table']}: {t['status']}"
            + (f" by {t.get('drop_op')} ({t.get('drop_reason')})" if t.get("drop_op") else "")
            for t in p.tables
        )
    )
    score = a.get("agreement_score")
    head.append(
        f"agree    {a.get('agreement_kind') or 'kind not recorded'}: {agreement_label(a)} ({', '.join(agreeing)})"
        + (f" · score {score:.2f}" if score is not None else "")
        + f" · pair cost {money(a.get('cost_usd'))}"
    )
    if p.prompt_matches_prefix is not None:
        head.append(
            "prompt   "
            + (
                "the pair's stored prompt equals the prefix shown below"
                if p.prompt_matches_prefix
                else "DIFFERS from the prefix shown below (pairs built with other render options?)"
            )
        )
    if p.texts_match_order is False:
        head.append(
            "texts    the stored chosen/rejected texts (what the trainer reads) are NOT in this render.action_order"
        )
    col = (width - 3) // 2
    left = _column(p.chosen, col, full)
    right = _column(p.rejected, col, full)
    side = [f"── chosen ({', '.join(agreeing) or 'teachers'})".ljust(col) + " │ " + "── rejected (the agent)"]
    side.append("─" * col + "─┼─" + "─" * col)
    for lft, rgt in zip_longest(left, right, fillvalue=""):
        side.append(lft.ljust(col) + " │ " + rgt)
    return "\n".join(head + side + ["", _format_state(p.state, width, full, agreeing)])
