"""``composer-pipeline experiment read-before-edit``: does training on this pipeline's data make a
policy *act* better on states it has not seen?

The whole chain, on generated sessions with a checkable right answer (:mod:`.sessions`):

1. write train and held-out Claude Code sessions (disjoint files, directories, values, wording);
2. ingest both through the normal ingest (``ingest_paths``), to ``trace_states`` / ``trace_messages``;
3. replay the train task states over the normal replay path (priced, cached, ledgered HTTP) against
   two teachers served by :class:`.rule_teacher.RuleTeacherServer` on loopback: a rule-following
   stand-in for strong API teachers on this controlled task, not a model;
4. pairs and hints with the normal code (``build_pairs``, ``normalize_pairs``, ``load_train_data``);
5. start policy: the base model supervised on the agents' own actions (:mod:`.sft`), so it edits an
   unread file about as often as the agents did. With ``--model tiny`` the base model is first
   trained from scratch on other generated sessions (every file pair, train wording) (:mod:`.pretrain`): a random-init
   model cannot write a held-out path, so no metric could move;
6. arms from the same start: ``start`` (no training), ``grpo``, ``sdpo`` (hint distillation),
   ``dpo``, ``all`` (the three channels), each through the normal ``train()``, for N seeds. The
   ``sdpo`` arm trains on the error-site states only (the only rows its loss reads; a step whose
   batch held none would have nothing to distill); the others on all train states;
7. held-out metrics by greedy decoding: ``read_when_unread`` (the next action reads the target file
   when it is unread) and the control ``edit_when_read`` (edits it once it was read: always reading
   must not win), every ``eval_every`` steps and at the end.

Out (under ``--out``): one JSON line per arm × seed on stdout and in ``results.jsonl``, a mean ± std
table (``table.md``), ``curves.json`` and ``curves.png`` (metric per step per arm), the data stores.
The sessions are fixed (seed 0); the seeds vary the start policy's fitting and every arm's training.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ARMS: dict[str, tuple[float, float, float] | None] = {  # (grpo, alpha, beta)
    "start": None,
    "grpo": (1.0, 0.0, 0.0),
    "sdpo": (0.0, 1.0, 0.0),
    "dpo": (0.0, 0.0, 1.0),
    "all": (1.0, 1.0, 1.0),
}
TEACHERS = ("rule-a", "rule-b")


@dataclass(frozen=True)
class ExperimentConfig:
    out: Path
    model: str = "tiny"  # tiny | local:smollm2-135m-instruct | a path
    seeds: int = 3
    steps: int = 60  # trainer steps per arm
    train_sessions: int = 48
    heldout_sessions: int = 40  # ~60 unread and ~60 read probe states: one state moves a share by < 0.02
    sft_steps: int = 200
    sft_lr: float = 1e-3
    prompt_tokens: int = 160  # policy prompts keep their last N tokens (fitting, arms, probes)
    pretrain_sessions: int = 600  # --model tiny: generated pretrain-split sessions the base model reads
    pretrain_steps: int = 2400  # --model tiny: steps training it from scratch (experiments.pretrain)
    learning_rate: float = 3e-4  # arms
    eval_every: int = 10
    lora: bool = False
    arms: tuple[str, ...] = tuple(ARMS)
    # the hinted teacher of the sdpo channel: the frozen start policy (a teacher that moves with the
    # student let this tiny model collapse, teacher and student agreeing on one broken answer: bench/RESULTS.md)
    hint_teacher: str = "initial"
    # RPO's NLL term on the chosen answers beside the DPO loss (plain DPO broke this tiny model's output
    # format within 60 steps: the margin grew by pushing both answers down)
    dpo_sft_weight: float = 1.0

    @classmethod
    def quick(cls, out: Path, **kw) -> "ExperimentConfig":
        """Tiny model, one seed, small sizes (≤ 10 minutes on 2 CPU cores)."""
        base = dict(model="tiny", seeds=1, steps=20, train_sessions=40, heldout_sessions=12, sft_steps=150,
                    sft_lr=1e-3, learning_rate=3e-4, eval_every=10, pretrain_steps=500)
        base.update({k: v for k, v in kw.items() if v is not None})
        return cls(out=out, **base)


# -- data: sessions -> ingest -> replay -> pairs ---------------------------------------------------
def _task_state_ids(store_root: Path) -> set[str]:
    """States whose prompt holds a file request (the rule has an answer there)."""
    from composer_pipeline.experiments.rule_teacher import rule_action
    from composer_pipeline.train.data import load_train_data
    from composer_pipeline.train.hints import HintTemplates

    data = load_train_data(str(store_root), heldout_fraction=0.0, hints=HintTemplates())
    return {p.state_id for p in data.prompts if rule_action(p.messages) is not None}


def build_data(work: Path, cfg: ExperimentConfig) -> dict[str, Any]:
    """Sessions -> ingest -> replay (rule teachers over HTTP) -> pairs. Returns the store roots and counts."""
    import pyarrow.compute as pc

    from composer_pipeline import render
    from composer_pipeline.experiments.rule_teacher import RuleTeacherServer
    from composer_pipeline.experiments.sessions import ingest_sessions, write_sessions
    from composer_pipeline.pairs.build import PairRecipe, build_pairs
    from composer_pipeline.pairs.normalize import NormalizeRecipe, normalize_pairs
    from composer_pipeline.store import Store
    from composer_pipeline.teachers.cache import ResponseCache
    from composer_pipeline.teachers.config import parse_teachers
    from composer_pipeline.teachers.ledger import Ledger
    from composer_pipeline.teachers.replay import build_requests, plan_requests, replay_requests

    repo = Path(__file__).resolve().parents[2]
    train_plans = write_sessions(work / "sessions" / "train", cfg.train_sessions, "train", seed=0)
    write_sessions(work / "sessions" / "heldout", cfg.heldout_sessions, "heldout", seed=0)
    train_root, heldout_root = work / "train_store", work / "heldout_store"
    counts = {"train": ingest_sessions(work / "sessions" / "train", train_root),
              "heldout": ingest_sessions(work / "sessions" / "heldout", heldout_root)}
    store = Store(str(train_root))
    states, messages = store.read_table("trace_states"), store.read_table("trace_messages")
    task = _task_state_ids(train_root)
    task_states = states.filter(pc.is_in(states["state_id"], value_set=__import__("pyarrow").array(sorted(task))))
    with RuleTeacherServer() as srv:
        cfg_t = parse_teachers({"ceiling_usd": 1.0, "teachers": [
            # each entry stands in for a distinct strong API teacher, so each names its own model: the
            # pair builder counts distinct models (base_url + model) as votes, not entry names
            {"name": n, "base_url": srv.url, "model": f"read-before-edit-{n}", "api_key_env": None,
             "input_usd_per_mtok": 0.01, "output_usd_per_mtok": 0.02, "budget_usd": 1.0, "max_concurrency": 4,
             "max_tokens": 256, "temperature": 0.0, "timeout_s": 30, "max_retries": 2} for n in TEACHERS]}, "experiment")
        opts = render.RenderOptions.from_recipe(None)
        ledger, cache = Ledger(work / "ledger.sqlite"), ResponseCache(work / "teacher_cache")
        requests, failed = build_requests(task_states, messages, cfg_t, opts)
        plan = plan_requests(requests, cfg_t, cache, ledger)
        if not plan.fits:
            raise RuntimeError(f"cost plan does not fit: {plan.reasons}")
        res = replay_requests(requests, cfg_t, {n: None for n in TEACHERS}, cache=cache, ledger=ledger,
                              run_id="read-before-edit", extra_failed=failed)
        calls = srv.calls
    store.write_table("teacher_replays", res.table)
    pairs = build_pairs(task_states, messages, res.table, PairRecipe.load(repo / "recipes" / "pairs.yaml"), opts)
    norm = normalize_pairs(pairs.pairs, NormalizeRecipe.load(repo / "recipes" / "normalize.yaml"))
    store.write_table("dpo_pairs", pairs.pairs)
    store.write_table("pairs", norm.kept)
    store.write_table("positives", pairs.positives)
    store.write_table("dropped_pairs", norm.dropped)
    # the hint arm reads error sites only: a view of the same tables restricted to them, so that every
    # step's batch holds one (a step without any would have nothing to distill)
    import pyarrow as pa

    err_ids = pa.array(sorted(set(states.filter(pc.field("has_error")).column("state_id").to_pylist())))
    hint_root = work / "error_site_store"
    hint_store = Store(str(hint_root))
    for name in ("trace_states", "pairs", "positives"):
        t = store.read_table(name)
        hint_store.write_table(name, t.filter(pc.is_in(t["state_id"], value_set=err_ids)))
    hint_store.write_table("trace_messages", messages)
    return {
        "train_store": str(train_root), "heldout_store": str(heldout_root), "error_site_store": str(hint_root),
        "error_sites": len(err_ids), "ingest": counts,
        "edit_first_sessions": sum(p.edit_first for p in train_plans), "train_sessions": len(train_plans),
        "task_states": len(task), "teacher_calls_http": calls, "replay": {k: res.summary[k] for k in ("calls", "cache_hits", "answered", "failed", "total_spend")},
        "pairs": norm.kept.num_rows, "pair_kinds": _pair_kinds(norm.kept), "positives": pairs.positives.num_rows,
        "dropped": norm.dropped.num_rows,
    }


def _pair_kinds(pairs) -> dict[str, int]:
    """How many pairs prefer which tool over which (``"Read over Edit"``): both directions are needed,
    or DPO learns "always X" instead of the rule."""
    from composer_pipeline.actions import Action

    def tool(js: str) -> str:
        a = Action.from_json(js)
        return a.tool_calls[0].name if a.tool_calls else "text"

    kinds: dict[str, int] = {}
    for c, r in zip(pairs.column("chosen").to_pylist(), pairs.column("rejected").to_pylist()):
        k = f"{tool(c)} over {tool(r)}"
        kinds[k] = kinds.get(k, 0) + 1
    return dict(sorted(kinds.items()))


# -- held-out probe -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    prompt: str  # rendered like the trainer renders it
    kind: str  # unread | read
    path: str


def heldout_cases(heldout_root: str, tokenizer, max_prompt_tokens: int = 384) -> list[Case]:
    from composer_pipeline.experiments.rule_teacher import task_state
    from composer_pipeline.train.data import load_train_data, render_prompt
    from composer_pipeline.train.hints import HintTemplates

    data = load_train_data(heldout_root, heldout_fraction=0.0, hints=HintTemplates())
    cases = []
    for p in data.prompts:
        st = task_state(p.messages)
        if st is None or st["edited"]:
            continue
        cases.append(Case(render_prompt(tokenizer, p.messages, p.tools, max_prompt_tokens), "read" if st["read"] else "unread", st["path"]))
    return sorted(cases, key=lambda c: (c.kind, c.path, c.prompt))


def probe(model, tokenizer, cases: list[Case], *, max_new_tokens: int = 96, batch_size: int = 16) -> dict[str, Any]:
    """Greedy next action on every case: the shares that read an unread target / edit a read one."""
    import torch

    from composer_pipeline.actions import ActionParseError, parse_action_text

    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id
    hits: dict[str, list[int]] = {"unread": [], "read": []}
    tool_hits: dict[str, list[int]] = {"unread": [], "read": []}
    with torch.no_grad():
        for i in range(0, len(cases), batch_size):
            chunk = cases[i : i + batch_size]
            enc = [tokenizer(c.prompt, add_special_tokens=False)["input_ids"] for c in chunk]
            w = max(map(len, enc))
            ids = torch.tensor([[pad] * (w - len(e)) + e for e in enc], device=model.device)
            mask = torch.tensor([[0] * (w - len(e)) + [1] * len(e) for e in enc], device=model.device)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, use_cache=True)
            for c, text in zip(chunk, tokenizer.batch_decode(out[:, w:], skip_special_tokens=True)):
                want = "Read" if c.kind == "unread" else "Edit"
                try:
                    calls = parse_action_text(text).tool_calls
                except ActionParseError:
                    calls = ()
                first = calls[0] if calls else None
                tool_hits[c.kind].append(int(first is not None and first.name == want))
                hits[c.kind].append(int(first is not None and first.name == want and first.arguments.get("file_path") == c.path))
    model.train(was_training)
    share = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"read_when_unread": share(hits["unread"]), "edit_when_read": share(hits["read"]),
            "read_tool_when_unread": share(tool_hits["unread"]), "edit_tool_when_read": share(tool_hits["read"]),
            "n_unread": len(hits["unread"]), "n_read": len(hits["read"])}


def _probe_callback(tokenizer, cases, every: int, curve: list[dict]):
    from transformers import TrainerCallback

    class ProbeEvery(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if model is not None and state.global_step % every == 0:
                curve.append({"step": state.global_step, **probe(model, tokenizer, cases)})

    return ProbeEvery()


# -- arms -----------------------------------------------------------------------------------------------
def arm_recipe(base, arm: str, cfg: ExperimentConfig, start: Path, seed: int):
    from composer_pipeline.train.config import LoraSection, Weights

    g, a, b = ARMS[arm]  # type: ignore[misc]
    r = replace(base, model=str(start), weights=Weights(grpo=g, alpha=a, beta=b))
    r = replace(r, optim=replace(r.optim, steps=cfg.steps, seed=seed, learning_rate=cfg.learning_rate),
                data=replace(r.data, heldout_fraction=0.0, max_prompt_tokens=cfg.prompt_tokens),
                # 96 tokens hold a whole Edit call (~80 with the tiny tokenizer): a shorter limit cuts every
                # Edit rollout into an unparseable one and so rewards reading everywhere
                grpo=replace(r.grpo, max_completion_length=96, num_generations=4, prompts_per_step=2),
                dpo=replace(r.dpo, max_completion_tokens=96, sft_weight=cfg.dpo_sft_weight),
                sdpo=replace(r.sdpo, teacher=cfg.hint_teacher),
                lora=LoraSection(enabled=cfg.lora, r=16, alpha=32) if cfg.lora else r.lora)
    return r


def run_experiment(cfg: ExperimentConfig, emit=print) -> dict[str, Any]:
    from composer_pipeline.experiments.sft import supervise_on_agent_actions
    from composer_pipeline.train.data import load_train_data
    from composer_pipeline.train.config import TrainRecipe
    from composer_pipeline.train.modeling import load_policy, resolve_model_path
    from composer_pipeline.train.trainer import train

    unknown = set(cfg.arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {list(ARMS)}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data_info = build_data(out / "data", cfg)
    emit(json.dumps({"data": data_info}))
    repo = Path(__file__).resolve().parents[2]
    base = TrainRecipe.load(repo / "recipes" / "train.yaml")
    train_rows = load_train_data(data_info["train_store"], heldout_fraction=0.0, hints=base.sdpo.hint).prompts
    if cfg.model == "tiny":  # trained from scratch on other generated sessions first (every file pair, no held-out request)
        from composer_pipeline.experiments.pretrain import pretrain_base

        base_model = str(pretrain_base(out / "base", sessions=cfg.pretrain_sessions, steps=cfg.pretrain_steps,
                                       max_tokens=cfg.prompt_tokens, hint_templates=base.sdpo.hint))
        meta = json.loads((out / "base" / "pretrain.json").read_text())
        emit(json.dumps({"base": {**meta["settings"], "windows": meta["windows"], "seconds": meta["seconds"],
                                  "final_loss": meta["curve"][-1]["loss"]}}))
    else:
        base_model = resolve_model_path(cfg.model)
    results, curves = [], {}
    for seed in range(cfg.seeds):
        ts = time.perf_counter()
        start = supervise_on_agent_actions(base_model, train_rows, out / f"seed{seed}" / "start", steps=cfg.sft_steps,
                                           seed=seed, lr=cfg.sft_lr,
                                           max_prompt_tokens=cfg.prompt_tokens)
        tok, start_model = load_policy(str(start))
        cases = heldout_cases(data_info["heldout_store"], tok, cfg.prompt_tokens)
        start_metrics = probe(start_model, tok, cases)
        del start_model
        sft_s = time.perf_counter() - ts
        for arm in cfg.arms:
            ta = time.perf_counter()
            curve = [{"step": 0, **start_metrics}]
            if ARMS[arm] is None:
                metrics, steps = start_metrics, 0
            else:
                recipe = arm_recipe(base, arm, cfg, start, seed)
                root = data_info["error_site_store"] if arm == "sdpo" else data_info["train_store"]
                res = train(root, recipe, out_dir=out / f"seed{seed}" / arm,
                            callbacks=[_probe_callback(tok, cases, cfg.eval_every, curve)])
                if curve[-1]["step"] != cfg.steps:
                    tok2, final = load_policy(str(res.checkpoint))
                    curve.append({"step": cfg.steps, **probe(final, tok2, cases)})
                metrics, steps = {k: v for k, v in curve[-1].items() if k != "step"}, len(res.losses)
            row = {"arm": arm, "seed": seed, "read_when_unread": metrics["read_when_unread"],
                   "edit_when_read": metrics["edit_when_read"], "steps": steps,
                   "seconds": round(time.perf_counter() - ta + (sft_s if arm == "start" else 0.0), 1),
                   "read_tool_when_unread": metrics["read_tool_when_unread"], "edit_tool_when_read": metrics["edit_tool_when_read"],
                   "n_unread": metrics["n_unread"], "n_read": metrics["n_read"]}
            emit(json.dumps(row))
            results.append(row)
            curves.setdefault(arm, []).append(curve)
    with (out / "results.jsonl").open("w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    (out / "curves.json").write_text(json.dumps(curves))
    table = summary_table(results)
    (out / "table.md").write_text(table + "\n")
    plot_curves(curves, out / "curves.png")
    return {"results": results, "table": table, "seconds": time.perf_counter() - t0, "data": data_info, "out": str(out)}


def _mean_std(xs: list[float], *, signed: bool = False, digits: int = 3) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return f"{m:{'+' if signed else ''}.{digits}f} ± {sd:.{digits}f}"


def summary_table(results: list[dict]) -> str:
    """Mean ± std over seeds per arm, and each arm's change from the start policy *of the same seed*
    (paired: the seeds' start policies differ more than most arms move them)."""
    start = {r["seed"]: r for r in results if r["arm"] == "start"}

    def delta(rs: list[dict], key: str) -> str:
        ds = [r[key] - start[r["seed"]][key] for r in rs if r["seed"] in start and r[key] is not None and start[r["seed"]][key] is not None]
        return _mean_std(ds, signed=True) if ds else "n/a"

    lines = ["| arm | seeds | read_when_unread | edit_when_read | Δ read_when_unread | Δ edit_when_read | read tool (any path) "
             "| edit tool (any path) | steps | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"] for r in results):
        rs = [r for r in results if r["arm"] == arm]
        d_read, d_edit = ("—", "—") if arm == "start" else (delta(rs, "read_when_unread"), delta(rs, "edit_when_read"))
        lines.append(f"| {arm} | {len(rs)} | {_mean_std([r['read_when_unread'] for r in rs])} | {_mean_std([r['edit_when_read'] for r in rs])} "
                     f"| {d_read} | {d_edit} "
                     f"| {_mean_std([r['read_tool_when_unread'] for r in rs])} | {_mean_std([r['edit_tool_when_read'] for r in rs])} "
                     f"| {rs[0]['steps']} | {_mean_std([r['seconds'] for r in rs], digits=0)} |")
    return "\n".join(lines)


def plot_curves(curves: dict[str, list[list[dict]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("read_when_unread", "edit_when_read")):
        for arm, runs in curves.items():
            steps = sorted({p["step"] for run in runs for p in run})
            ys = []
            for s in steps:
                vals = [p[key] for run in runs for p in run if p["step"] == s and p[key] is not None]
                ys.append(sum(vals) / len(vals) if vals else float("nan"))
            if len(steps) == 1:  # an arm that does not train (start): its level as a reference line
                ax.axhline(ys[0], linestyle="--", color="grey", label=arm)
            else:
                ax.plot(steps, ys, marker="o", label=arm)
        ax.set_title(f"held-out {key} (mean over seeds)")
        ax.set_xlabel("trainer step")
        ax.set_ylim(-0.05, 1.05)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
