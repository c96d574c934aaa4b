"""A prepared replay as bytes: what ``cost_plan`` built, read back by ``teacher_replays`` instead of built again.

In:  a :class:`~composer_pipeline.replay.run.ReplayRun` (its requests and unrendered states).
Out: :func:`dump_run` → JSON bytes; :func:`load_run` → the same run again, for the same teachers config.

The requests of a stream share their messages (``render.Conversation``), so each message is written once
(a pool) and each message list as "the list before it plus these" where it extends one already written:
the file grows with the session, not with the sum of its prefixes. A request's tokenizer count (local
teachers) is taken from the config again; its place in the stream's prompt cache is recomputed when it is
sent. Loading checks the config: a file written for other teachers (names, endpoints, models, prices) is
refused with :class:`StalePrepared`, and the caller prepares again.

Deliberately simplified: the whole file is read into memory at once (the requests live there anyway).
"""

from __future__ import annotations

import operator
from typing import Any

import orjson

from composer_pipeline.teachers.config import TeachersConfig

# 2: the agents' actions (escalation decides by them)
FORMAT = 2


class StalePrepared(ValueError):
    """A prepared file that does not belong to this config (or this format)."""


class _Lists:
    """Lists of shared objects, each written as indices into a pool, extending an earlier list when it can."""

    def __init__(self) -> None:
        self.pool: list[Any] = []
        self._index: dict[int, tuple[Any, int]] = {}  # id(obj) -> (obj, pool index)
        # each: [base list index or -1, [pool indices...]]
        self.lists: list[list[Any]] = []
        self._written: dict[int, tuple[list[Any], int]] = {}  # id(list) -> (list, its index)
        # stream key -> the last list written under it
        self._last: dict[Any, tuple[list[Any], int]] = {}

    def _item(self, obj: Any) -> int:
        hit = self._index.get(id(obj))
        if hit is None:
            hit = self._index[id(obj)] = (obj, len(self.pool))
            self.pool.append(obj)
        return hit[1]

    def add(self, items: list[Any] | None, key: Any) -> int:
        if items is None:
            return -1
        hit = self._written.get(id(items))
        if hit is not None:
            return hit[1]
        base, start = -1, 0
        last = self._last.get(key)
        if last is not None and len(items) >= len(last[0]) and all(map(operator.is_, last[0], items)):
            base, start = last[1], len(last[0])
        self.lists.append([base, [self._item(x) for x in items[start:]]])
        index = len(self.lists) - 1
        self._written[id(items)] = (items, index)
        self._last[key] = (items, index)
        return index


def dump_run(run) -> bytes:
    """``run`` (a ``ReplayRun``) as JSON bytes (module docstring)."""
    messages, tools = _Lists(), _Lists()
    requests = []
    for r in run.requests:
        key = (r.teacher.name, r.stream_id)
        body = {k: v for k, v in r.body.items() if k not in ("messages", "tools")}
        source = None
        if r.source is not None:
            source = [messages.add(r.source[0], ("source", key)), tools.add(r.source[1], None)]
        requests.append(
            {
                "state_id": r.state_id,
                "session_key": r.session_key,
                "teacher": r.teacher.name,
                "body": body,
                "messages": messages.add(r.body.get("messages"), key),
                "tools": tools.add(r.body.get("tools"), None),
                "call_id": r.call_id,
                "est_prompt_tokens": r.est_prompt_tokens,
                "worst_case_usd": r.worst_case_usd,
                "stream_id": r.stream_id,
                "order": r.order,
                "elided_messages": r.elided_messages,
                "cut_messages": r.cut_messages,
                "source": source,
                "skip_reason": r.skip_reason,
                "legacy_id": r.legacy_id,
                "prompt_bytes": r.prompt_bytes,
            }
        )
    return orjson.dumps(
        {
            "format": FORMAT,
            "identities": run.config.identities(),
            "messages": messages.pool,
            "message_lists": messages.lists,
            "tools": tools.pool,
            "tool_lists": tools.lists,
            "requests": requests,
            "unrendered": [list(u) for u in run.unrendered],
            "agents": run.agents,
        }
    )


def _rebuild(pool: list[Any], lists: list[list[Any]]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for base, items in lists:
        out.append((out[base] if base >= 0 else []) + [pool[i] for i in items])
    return out


def load_run(data: bytes, config: TeachersConfig):
    """The ``ReplayRun`` :func:`dump_run` wrote, for ``config``; :class:`StalePrepared` when the file was
    written for other teachers or in another format."""
    from composer_pipeline.replay.requests import ReplayRequest
    from composer_pipeline.replay.run import ReplayRun
    from composer_pipeline.teachers.token_count import counter_for

    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise StalePrepared(f"unreadable prepared requests: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StalePrepared("prepared requests in another format")
    if doc.get("identities") != orjson.loads(orjson.dumps(config.identities())):
        raise StalePrepared("prepared for other teachers (names, endpoints, models or prices differ)")
    messages = _rebuild(doc["messages"], doc["message_lists"])
    tools = _rebuild(doc["tools"], doc["tool_lists"])
    teachers = {t.name: t for t in config.teachers}
    counters = {t.name: counter_for(config, t) for t in config.teachers}
    requests = []
    for d in doc["requests"]:
        body = dict(d["body"])
        body["messages"] = messages[d["messages"]]
        if d["tools"] >= 0:
            body["tools"] = tools[d["tools"]]
        source = None
        if d["source"] is not None:
            source = (messages[d["source"][0]], tools[d["source"][1]] if d["source"][1] >= 0 else None)
        requests.append(
            ReplayRequest(
                d["state_id"],
                d["session_key"],
                teachers[d["teacher"]],
                _ordered(body),
                d["call_id"],
                d["est_prompt_tokens"],
                d["worst_case_usd"],
                d["stream_id"],
                d["order"],
                d["elided_messages"],
                d["cut_messages"],
                source,
                counters[d["teacher"]],
                skip_reason=d["skip_reason"],
                legacy_id=d["legacy_id"],
                prompt_bytes=d["prompt_bytes"],
            )
        )
    return ReplayRun(config, requests, [tuple(u) for u in doc["unrendered"]], doc["agents"])


def _ordered(body: dict[str, Any]) -> dict[str, Any]:
    """The body's keys in ``request_body``'s order (model, messages, params..., tools): what is sent."""
    head: dict[str, Any] = {k: body[k] for k in ("model", "messages") if k in body}
    rest = {k: v for k, v in body.items() if k not in head and k != "tools"}
    return {**head, **rest, **({"tools": body["tools"]} if "tools" in body else {})}
