"""The same view as the terminal's, in Markdown: the example rendered in Dagster asset metadata.

In:  a :class:`~.views.StateView` or :class:`~.views.PairView`; ``full``; ``max_messages`` (size-limited
     metadata keeps the last N prefix messages).
Out: :func:`render_markdown` -> Markdown: for a pair, the agreement and chosen | rejected as a table;
     then the state, the prefix messages (:func:`.walk.walk`) fenced, the action, the error that
     followed and every teacher's answer as a table.

Deliberately simplified: text goes into fences (longer than any backtick run in it) and table cells
(``|`` escaped, newlines as spaces); no HTML beyond ``<br>`` in cells.
"""

from __future__ import annotations

from typing import Any

from composer_pipeline.pairs.build import agreement_label
from composer_pipeline.show.views import PairView, View
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


def _fence(text: str, lang: str = "") -> str:
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    f = "`" * max(3, longest + 1)
    return f"{f}{lang}\n{text}\n{f}"


def _md_cell(s: Any) -> str:
    return str(s if s is not None else "-").replace("|", "\\|").replace("\n", " ")


def _md_action(action: dict | None, full: bool) -> str:
    return _fence("\n".join(action_lines(action, 0 if full else 400, 0 if full else 30)))


def render_markdown(view: View, *, full: bool = False, max_messages: int | None = None) -> str:
    """The same view as :func:`~.text.format_view`, in Markdown (e.g. Dagster asset metadata).

    ``max_messages`` keeps only the last N prefix messages (with a note), for size-limited metadata.
    """
    out: list[str] = []
    sv = view.state if isinstance(view, PairView) else view
    if isinstance(view, PairView):
        a = view.agreement
        agreeing = a.get("agreeing_teachers") or []
        out.append(f"## Pair `{view.pair_id}` ({view.pair_kind})")
        out.append("")
        tables_txt = ", ".join(f"{t['table']} ({t['status']})" for t in view.tables)
        out.append(f"- tables: {tables_txt}")
        out.append(
            f"- **agreement: {a.get('agreement_kind') or 'kind not recorded'}**, {agreement_label(a)}; teachers: {', '.join(agreeing)}"
            + (f", score {a['agreement_score']:.2f}" if a.get("agreement_score") is not None else "")
        )
        out.append(f"- state: `{sv.state_id}`")
        if view.prompt_matches_prefix is not None:
            out.append(
                f"- stored prompt equals the rendered prefix: {'yes' if view.prompt_matches_prefix else '**no**'}"
            )
        if view.texts_match_order is False:
            out.append("- stored chosen/rejected texts in this `render.action_order`: **no**")
        out.append("")
        out.append("| chosen (teacher consensus) | rejected (the agent's action) |")
        out.append("|---|---|")
        c = "<br>".join(_md_cell(x) for x in action_lines(view.chosen, 400, 30))
        r = "<br>".join(_md_cell(x) for x in action_lines(view.rejected, 400, 30))
        out.append(f"| {c} | {r} |")
        out.append("")
    else:
        agreeing = []
    m = sv.meta
    out.append(f"### State `{sv.state_id}`")
    out.append("")
    out.append(f"- stream: `{m.get('stream_id')}` ({m.get('stream_kind')})")
    out.append(f"- source: `{sv.source_file}` {lines_span(sv.source_lines)}")
    out.append(f"- agent: {' · '.join(str(b) for b in (m.get('model'), m.get('version'), m.get('timestamp')) if b)}")
    out.append(f"- prefix: {len(sv.prefix)} messages ({', '.join(f'{k}={v}' for k, v in sv.render.items())})")
    for miss in sv.missing:
        out.append(f"- missing: {miss}")
    out.append("")
    out.append("#### What the agent saw (the messages teachers are sent)")
    out.append("")
    if max_messages is not None and len(sv.prefix) > max_messages:
        out.append(f"*… {len(sv.prefix) - max_messages} earlier messages not shown*")
        out.append("")
    for turn in walk(sv.prefix, full, last=max_messages):
        if turn.role == "tool":
            if turn.interrupted:
                out.append(
                    f"**{turn.index}. tool ← {turn.tool_name}** `{turn.tool_call_id}` — *interrupted (no result before this step)*"
                )
                out.append("")
                continue
            out.append(f"**{turn.index}. tool ← {turn.tool_name}** `{turn.tool_call_id}`")
            out.append("")
            out.append(_fence(turn.body))
        elif turn.role == "assistant":
            out.append(f"**{turn.index}. assistant**")
            out.append("")
            out.append(_fence("\n".join(turn.lines) or "(empty)"))
        else:
            out.append(f"**{turn.index}. {turn.role}**")
            out.append("")
            out.append(_fence(turn.body))
        out.append("")
    out.append("#### What the agent did")
    out.append("")
    out.append(_md_action(sv.action, full))
    if sv.error_after:
        out.append("")
        out.append("#### The error that followed")
        out.append("")
        for e in sv.error_after:
            out.append(f"- `{e.get('tool_name')}` `{e.get('tool_use_id')}`:")
            out.append("")
            out.append(_fence(shorten(str(e.get("content") or ""), limits(full).tool_lines)))
    out.append("")
    out.append("#### Teachers")
    out.append("")
    if not sv.teachers:
        out.append("*not replayed yet*")
    else:
        out.append(teacher_summary(sv.teachers))
        out.append("")
        out.append("| teacher | model | status | cost | latency | tokens | notes | answer |")
        out.append("|---|---|---|---|---|---|---|---|")
        for t in sv.teachers:
            ans = (
                "<br>".join(_md_cell(x) for x in action_lines(t.action, 200, 8))
                if t.action
                else _md_cell(t.reason or t.raw_answer)
            )
            out.append(
                f"| {_md_cell(t.teacher)} | {_md_cell(t.model)} | {_md_cell(t.status)} | {money(t.cost_usd)} | "
                f"{secs(t.latency_s)} | {t.prompt_tokens}+{t.completion_tokens}"
                f"{f' ({t.cached_tokens} cached)' if t.cached_tokens else ''} | "
                f"{_md_cell(teacher_flags(t, agreeing).strip(' []'))}"
                f"{f' {t.elided_messages} messages elided before this point' if t.elided_messages else ''} | {ans} |"
            )
    return "\n".join(out) + "\n"
