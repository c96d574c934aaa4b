"""Replay requests: one body per trace state × teacher, rendered once, fitted to the teacher's window.

``make_request`` builds a :class:`ReplayRequest` (content-addressed ``call_id``), ``build_requests``
all of a run's, ``refit`` the one tighter fit after a provider's "too long"; ``with_cache_hints`` and
``stream_groups`` give session-affine scheduling. Used by :mod:`composer_pipeline.replay.plan` and
:mod:`composer_pipeline.replay.run`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from composer_pipeline.render import (
    FIT_BYTES_PER_TOKEN,
    Conversation,
    JsonSizes,
    RenderOptions,
    StreamRenderer,
    fit_messages,
    min_window,
    render_state,
)
from composer_pipeline.teachers.anthropic import CacheHint
from composer_pipeline.teachers.cache import (
    StreamCallIds,
    call_id,
    canonical_json,
    legacy_call_id,
)
from composer_pipeline.teachers.config import TeacherConfig, TeachersConfig
from composer_pipeline.teachers.pricing import worst_case_usd
from composer_pipeline.teachers.token_count import counter_for


@dataclass(frozen=True)
class ReplayRequest:
    state_id: str
    session_key: str | None
    teacher: TeacherConfig
    body: dict[str, Any]
    call_id: str
    est_prompt_tokens: int
    worst_case_usd: float
    # session-affine scheduling and the prompt_cache_key
    stream_id: str | None = None
    # position in its stream (prefix length): a stream's requests go in this order
    order: int = 0
    # what fitting the teacher's window did (render.fit_messages)
    elided_messages: int = 0
    cut_messages: int = 0
    # the unfitted prefix, for a tighter refit
    source: tuple[list[dict], list[dict] | None] | None = None
    # the teacher's tokenizer count (local models), else the bytes ratio
    counter: Callable[[Any], int] | None = None
    # its place in its stream (with_cache_hints): where to read, whether to write
    cache_hint: CacheHint | None = None
    # never sent, and why (over_context_window: even fitted it is too long)
    skip_reason: str | None = None
    # legacy_call_id of the body (computed with call_id; "" = compute when asked)
    legacy_id: str = ""
    # JSON bytes of its messages and tools (0 = not measured)
    prompt_bytes: int = 0


def request_body(teacher: TeacherConfig, messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
    """What is sent (and hashed): the model, the rendered prefix, the tools, the sampling params."""
    body: dict[str, Any] = {"model": teacher.model, "messages": messages, **teacher.request_params()}
    if tools:
        body["tools"] = tools
    return body


def make_request(
    state_id: str,
    session_key: str | None,
    teacher: TeacherConfig,
    messages: list[dict],
    tools: list[dict] | None,
    *,
    stream_id: str | None = None,
    order: int = 0,
    bytes_per_token: float | None = None,
    counter: Callable[[Any], int] | None = None,
    scale: float = 1.0,
    sizes: JsonSizes | None = None,
    ids: StreamCallIds | None = None,
) -> ReplayRequest:
    """One state × teacher request; fitted into the teacher's ``context_window`` when it has one (counted
    with ``counter``, the teacher's tokenizer, when given, else at ``bytes_per_token``). A request that does
    not fit even fitted carries its ``skip_reason`` and is never sent. ``sizes`` and ``ids`` measure and hash
    the messages a stream's requests share once (:func:`build_requests`)."""
    sizes = sizes if sizes is not None else JsonSizes()
    elided = cut = 0
    source = None
    skip = None
    if teacher.context_window is not None:
        budget = teacher.context_window - teacher.max_tokens
        fitted = fit_messages(
            messages,
            tools,
            budget,
            bytes_per_token=bytes_per_token or FIT_BYTES_PER_TOKEN,
            step=teacher.fit_elide_step,
            count=counter,
            scale=scale,
            sizes=sizes,
            key=(teacher.name, stream_id),
        )
        source = (messages, tools)
        messages, tools, elided, cut = fitted.messages, fitted.tools, fitted.elided, fitted.cut
        if not fitted.fits:
            skip = (
                f"over_context_window: not sent: about {fitted.tokens} prompt tokens after fitting ({elided} messages "
                f"elided, {cut} cut) exceed {teacher.name}'s context_window {teacher.context_window} less "
                f"max_tokens {teacher.max_tokens} ({budget} tokens)"
            )
    body = request_body(teacher, messages, tools)
    n_bytes = sizes.of_list(messages, (teacher.name, stream_id)) + (sizes.of_list(tools) if tools else 0)
    est, worst = worst_case_usd(body, teacher, n_bytes)
    if ids is None:
        cid, legacy = call_id(teacher.name, teacher.model, body, teacher.base_url), ""
    else:
        cid, legacy = ids.ids(body)
    return ReplayRequest(
        state_id,
        session_key,
        teacher,
        body,
        cid,
        est,
        0.0 if skip else worst,
        stream_id,
        order,
        elided,
        cut,
        source,
        counter,
        skip_reason=skip,
        legacy_id=legacy,
        prompt_bytes=n_bytes,
    )


def _legacy_id(r: ReplayRequest) -> str:
    return r.legacy_id or legacy_call_id(r.teacher.name, r.teacher.model, r.body)


# a provider said "too long": count 1/0.7 more tokens per byte and fit again, once
REFIT_FACTOR = 0.7


def refit(r: ReplayRequest) -> ReplayRequest | None:
    """The request fitted tighter after a provider's context-length answer (None: nothing to refit, or the
    tighter fit is still over the window: never sent again). Keeps the original ``call_id``: the answer is
    the answer to this state for this teacher."""
    if r.source is None:
        return None
    tighter = make_request(
        r.state_id,
        r.session_key,
        r.teacher,
        r.source[0],
        r.source[1],
        stream_id=r.stream_id,
        order=r.order,
        bytes_per_token=FIT_BYTES_PER_TOKEN * REFIT_FACTOR,
        counter=r.counter,
        scale=1 / REFIT_FACTOR,
    )
    if tighter.skip_reason is not None:
        return None
    return dataclasses.replace(tighter, call_id=r.call_id, legacy_id=_legacy_id(r))


def render_prompt(conv, state_row: dict, render_opts):
    """The rendered prefix (messages + tools) every teacher is sent for one state.

    The single rendering path of replay; ``composer-pipeline show`` prints this same function's output.
    """
    return render_state(conv, state_row, render_opts)


def check_windows(config: TeachersConfig, render_opts) -> None:
    """Every ``context_window`` holds the system prompt actually rendered (the ingest recipe's, which the
    teachers recipe cannot see at load), one turn and ``max_tokens``; else a ValueError naming the teacher."""
    system_prompt = (render_opts or RenderOptions()).system_prompt
    for t in config.teachers:
        if t.context_window is not None and t.context_window < min_window(t.max_tokens, system_prompt):
            raise ValueError(
                f"{config.source or 'teachers'}: teachers ({t.name}): context_window {t.context_window} is too small "
                f"for the system prompt ({len(system_prompt)} characters) plus one turn and max_tokens {t.max_tokens} "
                f"(needs at least {min_window(t.max_tokens, system_prompt)} tokens)"
            )


# a state whose rendered prefix holds no user message: its parent links are null, missing or dangling, so the
# teacher would see the system prompt alone; never sent (issue 34 §2), one row per teacher says so
NO_USER_TURN = (
    "no_user_turn: not sent: the rendered prefix holds no user message, only the system prompt "
    "(the state's parent links are null, missing or dangling)"
)


def build_requests(
    states: pa.Table, messages: pa.Table, config: TeachersConfig, render_opts
) -> tuple[list[ReplayRequest], list[tuple[str, str | None, str]]]:
    """All state × teacher requests (in state order, then teacher order), and (state_id, session_key,
    reason) for states that failed to render.

    Near-linear in a session's length: the states of a stream are prepared in stream order, their rendered
    messages are shared objects (``render.Conversation``), each measured (:class:`~render.JsonSizes`),
    counted by a local tokenizer and hashed (:class:`StreamCallIds`) once, so a state costs what its new
    messages cost rather than its whole prefix again."""
    check_windows(config, render_opts)
    conv = Conversation.from_table(messages)
    sizes = JsonSizes()
    canonical = _CanonicalJson()
    counters = {t.name: _memoized(counter_for(config, t)) for t in config.teachers}
    rows = states.to_pylist()
    by_state: list[list[ReplayRequest]] = [[] for _ in rows]
    failed_at: dict[int, tuple[str, str | None, str]] = {}
    ids: dict[tuple[str, str], StreamCallIds] = {}
    order = sorted(range(len(rows)), key=lambda i: (str(rows[i].get("stream_id")), _prefix_len(rows[i]), i))
    # render_prompt's output, extending each stream's previous state
    renderer = StreamRenderer(conv, render_opts)
    for i in order:
        row = rows[i]
        try:
            rs = renderer.render(row)
        # one bad state must not sink the partition: recorded per teacher
        except Exception as e:
            failed_at[i] = (
                row["state_id"],
                row.get("session_key"),
                f"render_error: {type(e).__name__}: {str(e)[:200]}",
            )
            continue
        if not rs.messages:
            failed_at[i] = (row["state_id"], row.get("session_key"), "render_error: empty prompt")
            continue
        skip = None if any(m.get("role") == "user" for m in rs.messages) else NO_USER_TURN
        for t in config.teachers:
            key = (t.name, str(row.get("stream_id")))
            if key not in ids:
                ids[key] = StreamCallIds(t.name, t.model, t.base_url, canonical)
            req = make_request(
                row["state_id"],
                row.get("session_key"),
                t,
                rs.messages,
                rs.tools,
                stream_id=row.get("stream_id"),
                order=_prefix_len(row),
                counter=counters[t.name],
                sizes=sizes,
                ids=ids[key],
            )
            by_state[i].append(req if skip is None else dataclasses.replace(req, skip_reason=skip, worst_case_usd=0.0))
    reqs = [r for per_state in by_state for r in per_state]
    return reqs, [failed_at[i] for i in sorted(failed_at)]


def _prefix_len(row: dict) -> int:
    return int(row.get("n_prefix_messages") or 0)


class _CanonicalJson:
    """Canonical JSON of each message object, made once (messages are shared by a stream's states)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, bytes]] = {}

    def __call__(self, obj: Any) -> bytes:
        hit = self._by_id.get(id(obj))
        if hit is None:
            hit = self._by_id[id(obj)] = (obj, canonical_json(obj))
        return hit[1]


def _memoized(count: Callable[[Any], int] | None) -> Callable[[Any], int] | None:
    """A tokenizer's count per message object, counted once (the objects are kept: an id is never reused)."""
    if count is None:
        return None
    seen: dict[int, tuple[Any, int]] = {}

    def counted(obj: Any) -> int:
        hit = seen.get(id(obj))
        if hit is None:
            hit = seen[id(obj)] = (obj, count(obj))
        return hit[1]

    return counted


def _extends(msgs: list[dict], prev: list[dict] | None) -> bool:
    return prev is not None and len(msgs) >= len(prev) and msgs[: len(prev)] == prev


def with_cache_hints(requests: list[ReplayRequest]) -> list[ReplayRequest]:
    """Each request with its :class:`CacheHint`: per teacher and stream, in stream order, whether it extends
    the previous request (then it reads through that request's messages) and whether a later request of the
    stream follows (then what it sends is worth writing to the cache). Used for ``api: anthropic``, where
    writes cost 1.25× and breakpoints say where to read."""
    out = list(requests)
    for idx in stream_groups(requests):
        prev: list[dict] | None = None
        for n, i in enumerate(idx):
            msgs = requests[i].body.get("messages") or []
            hint = CacheHint(len(prev) if prev is not None and _extends(msgs, prev) else None, write=n < len(idx) - 1)
            out[i] = dataclasses.replace(requests[i], cache_hint=hint)
            prev = msgs
    return out


def stream_groups(requests: list[ReplayRequest]) -> list[list[int]]:
    """Indices of ``requests`` per (teacher, stream), each in stream order (prefix length, then input order);
    a request without a stream is a group of its own."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        groups[(r.teacher.name, r.stream_id or f"#{i}")].append(i)
    return [sorted(idx, key=lambda i: (requests[i].order, i)) for idx in groups.values()]
