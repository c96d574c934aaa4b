"""The experiment's tiny base model: a small Qwen2 trained from scratch on generated sessions' text.

In:  a work directory, a session count (the ``pretrain`` split, a seed of its own: every (directory,
     name) pair, held-out ones included, but train request wording only, so no held-out state or
     request is among them and none is a session the experiment replays), steps, sizes, a seed.
Out: a model directory (safetensors + the tiny tokenizer) that knows the chat/tool-call format and
     has learned to copy a file path from the request into its action, plus ``pretrain.json``
     (the settings and the loss curve).

Why: a random-init model fitted only to the agents' actions memorizes train paths and never writes
a held-out one, so no metric can move (bench/RESULTS.md). A pretrained model brings copying with it;
one trained from scratch has to learn it, and that needs far more text than the replayed sessions
hold. So the base model reads the sessions' text (every token: requests, tool calls, tool results,
the agents' answers) as one window per agent step: the step's prompt cut to its last ``max_tokens``
tokens (as the policy will see it) followed by the agent's action. Short windows, each ending in a
step that copies a path, teach copying far faster per CPU-second than whole transcripts. The agents here act as in the experiment's sessions (half
edit first), so this base model is no better than the agents at the rule; it only knows the format.

Two choices make copying learnable for a model this small (bench/RESULTS.md): the corpus covers the
whole path space, so that after a directory every name is possible and only the request says which
(with held-out pairs absent, the model wrote a name it had seen after that directory instead); and
the tokenizer keeps a ``/`` with the piece after it (``/session``), so copying a name is matching one
token.

Resumable: every ``every`` steps the training state is saved (``resume.pt``) and a later call with the
same settings goes on from there (a run of ~20 CPU-minutes can span sessions on a shared machine).

Deliberately simplified: plain next-token cross-entropy, AdamW at a constant rate after a short
warm-up, fixed-size random batches, prompts cut to their last ``max_tokens`` tokens like the trainer's.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from composer_pipeline.actions import Action, ActionOrder, ToolCall, tool_call_json
from composer_pipeline.experiments.sessions import ingest_sessions, write_sessions
from composer_pipeline.tiny_model import build_tiny_model
from composer_pipeline.train.config import HintTemplates
from composer_pipeline.train.hints import build_hint, with_hint
from composer_pipeline.train.modeling import load_policy


def _session_text(root: Path, order: ActionOrder = "sorted") -> list[str]:
    """The words of the generated sessions (requests, tool calls as their text form writes them in
    ``order``, tool results, answers), for the tokenizer: their paths' pieces and keys become single
    tokens, uuids and timestamps do not."""
    texts = []
    for f in sorted(Path(root).rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            content = json.loads(line)["message"]["content"]
            for part in [content] if isinstance(content, str) else content:
                if isinstance(part, str):
                    texts.append(part)
                elif part.get("type") == "tool_use":
                    texts.append(tool_call_json(part["name"], part["input"], order))
                else:
                    texts.append(str(part.get("text") or part.get("content") or ""))
    return texts


# errors a hint may name: drawn independently of the step, so that what the hint teaches is "take the
# step it names", not which error calls for which step (that rule is what the arms must learn)
_HINT_ERRORS = [
    "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>",
    "<tool_use_error>String to replace not found in file.</tool_use_error>",
    "Error: File does not exist.",
    "Error: Permission denied",
]


def _hint_for(action, rng: random.Random, templates, order: ActionOrder = "sorted") -> str | None:
    """A hint in the trainer's own format (``train.hints.build_hint``) whose "better next step" is
    ``action``: the failed step named in it is the other tool on the same file, its error drawn from
    :data:`_HINT_ERRORS`. None for an action without a file tool call."""

    call = action.tool_calls[0] if action.tool_calls else None
    path = call.arguments.get("file_path") if call else None
    if call is None or not path:
        return None
    if call.name == "Read":
        key = rng.choice(["PORT", "LIMIT", "DEPTH", "BATCH"])
        a, b = rng.sample(range(2, 99), 2)
        other = ToolCall(
            "Edit", {"file_path": path, "old_string": f"{key} = {a}", "new_string": f"{key} = {b}"}, "call_0"
        )
    else:
        other = ToolCall("Read", {"file_path": path}, "call_0")
    error_after = json.dumps([{"tool_name": other.name, "content": rng.choice(_HINT_ERRORS)}])
    return build_hint(Action(tool_calls=(other,)).to_json(), error_after, action.to_json(), templates, order)


def _windows(
    store_root: Path,
    tokenizer,
    max_tokens: int,
    hint_share: float = 0.0,
    seed: int = 0,
    templates=None,
    order: ActionOrder = "sorted",
) -> list[list[int]]:
    """One token window per agent step: its prompt (last ``max_tokens`` tokens) and the agent's action
    (text form in ``order``). A ``hint_share`` of the steps get a corrective hint before the action, in
    the trainer's format, naming exactly the action that follows (whatever it is, right or wrong by the rule)."""
    from composer_pipeline.train.data import load_train_data, render_chat_prompt

    templates = templates or HintTemplates()
    rng = random.Random(f"hints|{seed}")
    eos = tokenizer.eos_token or ""
    out = []
    for r in load_train_data(str(store_root), heldout_fraction=0.0, hints=templates).prompts:
        action = Action.from_json(r.agent_action)
        messages = r.messages
        if hint_share and rng.random() < hint_share:
            hint = _hint_for(action, rng, templates, order)
            if hint is not None:
                messages = with_hint(messages, hint, templates.role)
        text = render_chat_prompt(tokenizer, messages, r.tools, max_tokens) + action.to_text(order) + eos
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def pretrain_base(
    work: Path,
    *,
    sessions: int,
    steps: int,
    hidden: int = 128,
    layers: int = 4,
    vocab_size: int = 1024,
    lr: float = 3e-3,
    batch_size: int = 16,
    max_tokens: int = 160,
    hint_share: float = 0.25,
    hint_templates=None,
    seed: int = 0,
    every: int = 50,
    on_step=None,
    device: str | None = None,
    action_order: ActionOrder = "sorted",
) -> Path:
    """Train the tiny base model from scratch; returns its directory (reused when already trained
    with the same settings). ``on_step(step, loss, model, tokenizer)`` runs every ``every`` steps;
    ``device`` as :func:`~composer_pipeline.train.modeling.load_policy` takes it; ``action_order``: the tool
    calls' key order in its tokenizer corpus, chat template and windows."""
    import torch

    templates = hint_templates or HintTemplates()
    work = Path(work)
    model_dir = work / "model"
    settings = {
        "sessions": sessions,
        "steps": steps,
        "hidden": hidden,
        "layers": layers,
        "vocab_size": vocab_size,
        "lr": lr,
        "batch_size": batch_size,
        "max_tokens": max_tokens,
        "hint_share": hint_share,
        "hint_template": templates.with_consensus,
        "seed": seed,
        "corpus": "pretrain-split-v3",
        "path_words": True,
    }
    # (absent for sorted: base models trained before the setting stay reusable)
    if action_order != "sorted":
        settings["action_order"] = action_order
    meta = work / "pretrain.json"
    if (
        meta.is_file()
        and (model_dir / "config.json").is_file()
        and json.loads(meta.read_text())["settings"] == settings
    ):
        return model_dir
    t0 = time.perf_counter()
    if not (work / "store" / "trace_states.parquet").is_file() or not (work / "init" / "config.json").is_file():
        # the pretrain split: every (directory, name) pair, train wording (never a held-out request)
        write_sessions(work / "sessions", sessions, "pretrain", seed=1000 + seed)  # the replayed ones use seed 0
        ingest_sessions(work / "sessions", work / "store")
        build_tiny_model(
            work / "init",
            vocab_size=vocab_size,
            hidden=hidden,
            layers=layers,
            seed=seed,
            corpus=_session_text(work / "sessions", action_order) + 50 * [templates.with_consensus, *_HINT_ERRORS],
            path_words=True,
            action_order=action_order,
        )
    tok, model = load_policy(str(work / "init"), device)
    seqs = _windows(
        work / "store", tok, max_tokens, hint_share=hint_share, seed=seed, templates=templates, order=action_order
    )
    if not seqs:
        raise ValueError(f"no sessions to pretrain on under {work / 'store'}")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    pad = tok.pad_token_id
    curve: list[dict] = []
    first, spent = 1, 0.0
    # resumable: every `every` steps the model, optimizer, schedule, batch sampler and curve are saved, so an
    # interrupted run (a session that ends, a budget) goes on from there with the same settings
    resume = work / "resume.pt"
    if resume.is_file():
        state = torch.load(resume, weights_only=False)
        if state["settings"] == settings:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            rng.setstate(state["rng"])
            curve, first, spent = state["curve"], state["step"] + 1, state["seconds"]
    model.train()
    for step in range(first, steps + 1):
        batch = [seqs[rng.randrange(len(seqs))] for _ in range(batch_size)]
        w = max(map(len, batch))
        ids = torch.tensor([[pad] * (w - len(s)) + s for s in batch], device=model.device)
        mask = torch.tensor([[0] * (w - len(s)) + [1] * len(s) for s in batch], device=model.device)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[
            :, :-1
        ]
        target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % every == 0 or step == steps:
            curve.append({"step": step, "loss": round(loss.item(), 4)})
            if on_step is not None:
                on_step(step, loss.item(), model, tok)
                model.train()
            tmp = resume.with_suffix(".tmp")
            torch.save(
                {
                    "settings": settings,
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "sched": sched.state_dict(),
                    "rng": rng.getstate(),
                    "curve": curve,
                    "step": step,
                    "seconds": spent + time.perf_counter() - t0,
                },
                tmp,
            )
            tmp.replace(resume)
    model.save_pretrained(model_dir, safe_serialization=True)
    tok.save_pretrained(model_dir)
    meta.write_text(
        json.dumps(
            {
                "settings": settings,
                "windows": len(seqs),
                "seconds": round(spent + time.perf_counter() - t0, 1),
                "curve": curve,
            },
            indent=1,
        )
    )
    return model_dir
