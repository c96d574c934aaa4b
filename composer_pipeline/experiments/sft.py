"""Supervised start policy: the base model fitted to the agents' own (flawed) actions.

In:  a model path, training prompt rows (:class:`composer_pipeline.train.data.PromptRow`), steps, seed.
Out: a checkpoint directory (safetensors + tokenizer) of a model that imitates the agents: on the
     read-before-edit sessions it edits an unread file about as often as the agents did (~half).

Plain next-token cross-entropy on the agent's action text (``Action.to_text()`` + eos) after the
same rendered prompt the trainer uses; AdamW, constant learning rate, batches drawn with the seed.
"""

from __future__ import annotations

import random
from pathlib import Path

from composer_pipeline.actions import Action, ActionOrder
from composer_pipeline.train.modeling import load_policy


def supervise_on_agent_actions(
    model_path: str,
    rows,
    out_dir: Path,
    *,
    steps: int,
    seed: int,
    lr: float = 1e-3,
    batch_size: int = 8,
    max_prompt_tokens: int = 384,
    max_completion_tokens: int = 96,
    device: str | None = None,
    action_order: ActionOrder = "sorted",
) -> Path:
    """Fit ``model_path`` to the agents' actions (text form in ``action_order``); saved to ``out_dir``."""
    import torch

    from composer_pipeline.train.data import render_chat_prompt
    from composer_pipeline.train.losses import completion_logps

    if not rows:
        raise ValueError("no prompt rows to supervise on")
    torch.manual_seed(seed)
    tok, model = load_policy(model_path, device)
    model.train()
    eos = tok.eos_token or ""
    pad = tok.pad_token_id
    examples = []
    for r in rows:
        p = tok(render_chat_prompt(tok, r.messages, r.tools, max_prompt_tokens), add_special_tokens=False)["input_ids"]
        c = tok(Action.from_json(r.agent_action).to_text(action_order) + eos, add_special_tokens=False)["input_ids"][
            :max_completion_tokens
        ]
        examples.append((p, c))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = random.Random(seed)
    dev = model.device
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        pw, cw = max(len(p) for p, _ in batch), max(len(c) for _, c in batch)
        pi = torch.tensor([[pad] * (pw - len(p)) + p for p, _ in batch], device=dev)
        pm = torch.tensor([[0] * (pw - len(p)) + [1] * len(p) for p, _ in batch], device=dev)
        ci = torch.tensor([c + [pad] * (cw - len(c)) for _, c in batch], device=dev)
        cm = torch.tensor([[1] * len(c) + [0] * (cw - len(c)) for _, c in batch], device=dev)
        loss = -(completion_logps(model, pi, pm, ci, cm) / cm.sum(-1)).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir
