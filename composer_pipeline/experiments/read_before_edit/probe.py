"""The read-before-edit experiment's held-out probe: greedy next actions, scored per state kind.

In:  the held-out store, a tokenizer and a policy (any model with ``generate``).
Out: per held-out state its kind (:data:`STATE_KINDS`), the answer's first call, whether it was the right
     tool and the right tool on the right path, the answer's full text and whether it parses; and the
     shares (:func:`score_outputs`): ``combined`` = min(reading an unread target, editing a once-read one)
     on the decisive kinds, where the agents split 50/50, so always reading or always editing scores 0.

Prompts are rendered and cut as the trainer renders its prompts. Deliberately simplified: greedy decoding
only, and only the answer's first call is judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from composer_pipeline.actions import ActionParseError, parse_action_text, parse_failure
from composer_pipeline.experiments.rule_teacher import _calls, _text, is_error_result, task_state
from composer_pipeline.train.config import HintTemplates

# held-out state kinds (where the latest request stands, and what the last turn was); the decisive
# ones are those where the agents split 50/50, so a policy imitating them is at chance there
STATE_KINDS = ("request", "after_decoy", "after_error", "after_first_read", "after_second_read")
DECISIVE_READ = ("request", "after_decoy")  # target unread: Read it
DECISIVE_EDIT = ("after_first_read",)  # target read once: Edit it


@dataclass(frozen=True)
class Case:
    prompt: str  # rendered like the trainer renders it
    # unread | read (the target's state: Read is right / Edit is right)
    kind: str
    path: str
    # one of STATE_KINDS: where the latest request stands and what the last turn was
    state: str = ""
    state_id: str = ""


def state_kind(messages: list[dict]) -> str | None:
    """Which of :data:`STATE_KINDS` a prompt is (None: no file request, or the target already edited).

    ``request``: the request is the last turn; ``after_decoy``: the last turn read *another* file
    (the target is unread); ``after_error``: the last turn failed; ``after_first_read`` /
    ``after_second_read``: the target was read once / twice."""

    st = task_state(messages)
    if st is None or st["edited"]:
        return None
    last = messages[-1]
    if last.get("role") == "user":
        return "request"
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"}
    prev = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    calls = _calls(prev) if prev else []
    if any(is_error_result(results.get(cid) or "") for cid, _, _ in calls):
        return "after_error"
    if not st["read"]:
        return "after_decoy" if any(n == "Read" for _, n, _ in calls) else "other_unread"
    start = max(
        i for i, m in enumerate(messages) if m.get("role") == "user" and st["request"] == _text(m.get("content"))
    )
    reads = sum(
        1
        for m in messages[start:]
        if m.get("role") == "assistant"
        for cid, n, a in _calls(m)
        if n == "Read" and a.get("file_path") == st["path"] and not is_error_result(results.get(cid) or "")
    )
    return "after_first_read" if reads == 1 else "after_second_read"


def heldout_cases(heldout_root: str, tokenizer, max_prompt_tokens: int = 384, states: str = "all") -> list[Case]:
    """The probe's cases: every held-out state whose target is not yet edited (``states="decisive"``:
    only the decisive kinds), rendered and cut as the trainer renders its prompts."""
    from composer_pipeline.train.data import load_train_data, render_chat_prompt

    data = load_train_data(heldout_root, heldout_fraction=0.0, hints=HintTemplates())
    cases = []
    for p in data.prompts:
        kind, st = state_kind(p.messages), task_state(p.messages)
        if kind is None or st is None or (states == "decisive" and kind not in DECISIVE_READ + DECISIVE_EDIT):
            continue
        cases.append(
            Case(
                render_chat_prompt(tokenizer, p.messages, p.tools, max_prompt_tokens),
                "read" if st["read"] else "unread",
                st["path"],
                kind,
                p.state_id,
            )
        )
    return sorted(cases, key=lambda c: (c.kind, c.path, c.prompt))


def _share(xs: list[int]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def score_outputs(outputs: list[dict]) -> dict[str, Any]:
    """Shares from per-state outputs (``state``, ``kind``, ``hit``, ``tool_hit``): over all unread / read
    states (``read_when_unread``, ``edit_when_read``), per state kind, and on the decisive kinds, whose
    ``combined`` = min(decisive read, decisive edit): always reading or always editing scores 0 there."""
    by = lambda pred, key: [o[key] for o in outputs if pred(o)]  # noqa: E731
    # cells written before 2026-11-27 lack it
    parsed = [o["parsed"] for o in outputs if "parsed" in o]
    errors: dict[str, int] = {}
    for o in outputs:
        if o.get("parse_error"):
            errors[o["parse_error"]] = errors.get(o["parse_error"], 0) + 1
    dec_read = _share(by(lambda o: o["state"] in DECISIVE_READ, "hit"))
    dec_edit = _share(by(lambda o: o["state"] in DECISIVE_EDIT, "hit"))
    return {
        "read_when_unread": _share(by(lambda o: o["kind"] == "unread", "hit")),
        "edit_when_read": _share(by(lambda o: o["kind"] == "read", "hit")),
        "read_tool_when_unread": _share(by(lambda o: o["kind"] == "unread", "tool_hit")),
        "edit_tool_when_read": _share(by(lambda o: o["kind"] == "read", "tool_hit")),
        "n_unread": sum(o["kind"] == "unread" for o in outputs),
        "n_read": sum(o["kind"] == "read" for o in outputs),
        "decisive_read": dec_read,
        "decisive_edit": dec_edit,
        "combined": None if dec_read is None or dec_edit is None else min(dec_read, dec_edit),
        # share of the greedy answers that parse as an action, and the failures by reason
        "parse_rate": _share(parsed),
        "parse_errors": dict(sorted(errors.items())),
        "kinds": {
            k: {"n": len(h), "hit": _share(h), "tool": _share(by(lambda o, k=k: o["state"] == k, "tool_hit"))}
            for k in STATE_KINDS
            if (h := by(lambda o, k=k: o["state"] == k, "hit"))
        },
    }


def probe(model, tokenizer, cases: list[Case], *, max_new_tokens: int = 96, batch_size: int = 16) -> dict[str, Any]:
    """Greedy next action on every case: the shares that read an unread target / edit a read one
    (:func:`score_outputs`), and ``outputs``: one record per state (its kind, the answer's first call,
    whether it was the right tool, and the right tool on the right path)."""
    import torch

    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id
    outputs: list[dict] = []
    with torch.no_grad():
        for i in range(0, len(cases), batch_size):
            chunk = cases[i : i + batch_size]
            enc = [tokenizer(c.prompt, add_special_tokens=False)["input_ids"] for c in chunk]
            w = max(map(len, enc))
            ids = torch.tensor([[pad] * (w - len(e)) + e for e in enc], device=model.device)
            mask = torch.tensor([[0] * (w - len(e)) + [1] * len(e) for e in enc], device=model.device)
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                use_cache=True,
            )
            for c, text in zip(chunk, tokenizer.batch_decode(out[:, w:], skip_special_tokens=True)):
                want = "Read" if c.kind == "unread" else "Edit"
                failure = parse_failure(text)
                try:
                    calls = parse_action_text(text).tool_calls
                except ActionParseError:
                    calls = ()
                first = calls[0] if calls else None
                tool_hit = int(first is not None and first.name == want)
                outputs.append(
                    {
                        "state_id": c.state_id,
                        "state": c.state,
                        "kind": c.kind,
                        "want": want,
                        "path": c.path,
                        "answer": f"{first.name} {first.arguments.get('file_path', '')}".strip()
                        if first
                        else f"text: {text[:60]}",
                        "tool_hit": tool_hit,
                        "hit": int(first is not None and bool(tool_hit) and first.arguments.get("file_path") == c.path),
                        # the whole answer, and whether it parses as an action (else why not)
                        "text": text,
                        "parsed": int(failure is None),
                        "parse_error": failure,
                    }
                )
    model.train(was_training)
    return {**score_outputs(outputs), "outputs": outputs}


def probe_callback(tokenizer, cases, every: int, curve: list[dict], max_new_tokens: int = 96):
    from transformers import TrainerCallback

    class ProbeEvery(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if model is not None and state.global_step % every == 0:
                m = probe(model, tokenizer, cases, max_new_tokens=max_new_tokens)
                curve.append({"step": state.global_step, **{k: v for k, v in m.items() if k != "outputs"}})

    return ProbeEvery()
