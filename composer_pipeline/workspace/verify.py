"""``workspace verify``: the environment's prediction for every file-tool call of the stored trace states,
beside what really happened.

In:  a Store with ``trace_states`` and ``trace_messages``.
Out: one :class:`Verdict` per file-tool call of a state's action (a state with parallel calls gives one per
     call, executed in order in the same workspace); :func:`summarize` — the share with a verdict, the
     agreement where there is one, the share of observed failures predicted.

Deliberately simplified: a call whose result never came (interrupted) has ``observed_ok`` None and counts
in neither agreement nor failures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from composer_pipeline.store import Store
from composer_pipeline.workspace.files import FILE_TOOLS
from composer_pipeline.workspace.history import Call, SessionHistory


@dataclass
class Verdict:
    state_id: str
    tool: str
    predicted_ok: bool | None
    observed_ok: bool | None
    reason: str
    observed: str = ""  # the recorded result's first line
    # the environment's observation's first line
    predicted: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_store(store: str | Store) -> Iterator[Verdict]:
    st = store if isinstance(store, Store) else Store(store)
    for name in ("trace_states", "trace_messages"):
        if not st.exists(name):
            raise FileNotFoundError(f"no {name} table in {st.root}: run `composer-pipeline ingest` first")
    states = st.read_table("trace_states").to_pylist()
    history = SessionHistory(st.read_table("trace_messages"), states)
    for state in states:
        calls = [c for c in history.observed_calls(state) if c.name in FILE_TOOLS]
        if not calls:
            continue
        ws = history.workspace_at(state)
        for call in calls:
            out = ws.execute(call.name, call.arguments)
            observed = call.event(own=True)
            yield Verdict(
                state_id=state["state_id"],
                tool=call.name,
                predicted_ok=out.ok,
                observed_ok=observed.ok,
                reason=out.reason,
                observed=_first_line(call),
                predicted=out.observation.split("\n", 1)[0][:200],
            )
            if out.ok is None and observed.ok is not None:
                # what really happened, where the environment could not tell
                ws.observe(observed)


def _first_line(call: Call) -> str:
    return "" if call.result is None else call.result["content"].split("\n", 1)[0][:200]


def summarize(verdicts: list[Verdict]) -> dict[str, Any]:
    n = len(verdicts)
    decided = [v for v in verdicts if v.predicted_ok is not None]
    judged = [v for v in decided if v.observed_ok is not None]
    agree = sum(v.predicted_ok == v.observed_ok for v in judged)
    failures = [v for v in verdicts if v.observed_ok is False]
    caught = sum(v.predicted_ok is False for v in failures)
    return {
        "file_tool_calls": n,
        "with_verdict": len(decided),
        "verdict_share": len(decided) / n if n else None,
        "agreement": agree / len(judged) if judged else None,
        "agreeing": agree,
        "judged": len(judged),
        "observed_failures": len(failures),
        "failures_predicted": caught,
        "failure_recall": caught / len(failures) if failures else None,
    }


def workspace_snapshots(store: str | Store, state_ids: list[str]) -> dict[str, str]:
    """``state_id`` -> the JSON snapshot of the workspace its agent had seen (the ``workspace`` column the
    GRPO reward ``workspace_executes`` reads); states not in the store get none."""

    st = store if isinstance(store, Store) else Store(store)
    if not (st.exists("trace_states") and st.exists("trace_messages")):
        raise FileNotFoundError(
            f"the workspace_executes reward needs trace_states and trace_messages in {st.root}: run ingest there"
        )
    wanted = set(state_ids)
    states = st.read_table("trace_states").to_pylist()
    history = SessionHistory(st.read_table("trace_messages"), states)
    out = {}
    for state in states:
        if state["state_id"] in wanted:
            out[state["state_id"]] = orjson.dumps(history.workspace_at(state).to_dict()).decode()
    return out
