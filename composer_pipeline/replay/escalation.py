"""Cheap teachers first: which requests of a replay go out, tier by tier (teachers recipe ``escalation``).

In:  a run's requests (state × teacher), their results as they arrive, the agent's action per state, the
     pair recipe and the teachers config.
Out: :func:`waves` → the indices of the requests to send, one tier at a time (without ``escalation``: one
     wave of every request); :meth:`Escalation.reason` → why a state's later tiers were not called.

A state goes to the next tier only while the answers so far could still make a pair: they differ from the
agent's decision or from each other (the pair builder's own rule, :func:`pairs.build.pair_ruled_out`). Every
request of every tier is still in the cost plan (its worst case is reserved as if it were sent); a request
not sent gets a ``teacher_replays`` row with status ``skipped`` and the reason (``not_escalated: ...``).
A re-run decides alike from the answers the cache and the ledger already hold, so it sends nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from composer_pipeline.pairs.build import Voter, pair_ruled_out, voters_from_config
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.teachers.config import TeachersConfig


@dataclass
class Escalation:
    """The tiers of one run and what it has decided so far (``stopped``: state id → the reason)."""

    config: TeachersConfig
    # state_id -> the agent's action JSON (trace_states.action)
    agents: dict[str, str]
    recipe: PairRecipe
    voters: dict[str, Voter] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, config: TeachersConfig, agents: dict[str, str], recipe: PairRecipe | None) -> Escalation | None:
        """The run's escalation, or None when the config has no ``escalation`` (every teacher at once)."""
        if not config.escalation:
            return None
        return cls(config, agents, recipe or PairRecipe.load(), voters_from_config(config))

    def reason(self, state_id: str) -> str:
        return self.stopped.get(state_id) or "not_escalated"


def _vote_row(r: Any, res: Any) -> dict:
    """What :func:`pair_ruled_out` reads of one answer (the ``teacher_replays`` fields the pair builder uses)."""
    return {
        "teacher": r.teacher.name,
        "status": res.status,
        "action": res.action.to_json() if res.action is not None else None,
        "call_id": r.call_id,
        "model": r.teacher.model,
        "finish_reason": res.finish_reason,
    }


def waves(requests: list[Any], results: list[Any], esc: Escalation | None) -> Iterator[list[int]]:
    """Indices of ``requests`` (``replay.ReplayRequest``) to send, tier by tier; resumed once a wave's
    ``results`` (``client.CallResult``, None until sent) are filled in."""
    if esc is None:
        yield list(range(len(requests)))
        return
    tier_of = {t.name: esc.config.tier_of(t.name) for t in esc.config.teachers}
    open_states = {r.state_id for r in requests}
    answered: dict[str, list[dict]] = {}
    for k, names in enumerate(esc.config.escalation):
        wave = [i for i, r in enumerate(requests) if tier_of[r.teacher.name] == k and r.state_id in open_states]
        yield wave
        for i in wave:
            res = results[i]
            if res is not None:
                answered.setdefault(requests[i].state_id, []).append(_vote_row(requests[i], res))
        asked = ", ".join(n for tier in esc.config.escalation[: k + 1] for n in tier)
        for sid in sorted(open_states):
            why = pair_ruled_out(esc.agents.get(sid), answered.get(sid, []), esc.voters, esc.recipe)
            if why is not None:
                open_states.discard(sid)
                esc.stopped[sid] = (
                    f"not_escalated: {why}: not sent, no pair can come of this state after tier {k + 1} ({asked})"
                )
