"""``composer-pipeline experiment read-before-edit``: does training on this pipeline's data make a
policy *act* better on states it has not seen, and which part of the training does it?

The whole chain, on generated sessions with a checkable right answer (:mod:`.sessions`):

1. write train and held-out Claude Code sessions (disjoint target files, wording; held-out sessions
   from a seed range no design round looked at, ``sessions.HELDOUT_SEED``; no train session reads a
   held-out file, not even as a decoy);
2. ingest both through the normal ingest (``ingest_paths``), to ``trace_states`` / ``trace_messages``;
3. replay the train task states over the normal replay path (priced, cached, ledgered HTTP) against
   teachers that disagree (:mod:`.rule_teacher` variants: the rule, two that err at their own fifth
   of the states, one that writes where the rule edits, and the rule's model asked twice), so pairs
   come from real consensus (2, 3 or 4 of 4 models, ties skipped) and the distinct-model rule is used;
4. pairs and hints with the normal code (``build_pairs``, ``normalize_pairs``, ``load_train_data``);
5. start policy: the base model supervised on the agents' own actions (:mod:`.sft`), so it edits an
   unread file about as often as the agents did. With ``--model tiny`` the base model is first
   trained from scratch on other generated sessions (every file pair, train wording) (:mod:`.pretrain`): a random-init
   model cannot write a held-out path, so no metric could move;
6. arms from the same start (:data:`ARMS`), each through the normal ``train()``, N seeds: ``grpo``,
   ``sdpo`` (hint distillation, error-site rows only), ``dpo`` (RPO: preference + NLL on the chosen
   answers), ``all``, and the controls that attribute a gain: ``nll`` (the same NLL on the same
   chosen answers, no preference term), ``dpo_shuffled`` (the pairs' sides swapped at a seeded random
   half), ``grpo_shuffled`` (a seeded prompt order instead of error sites first), ``nll_all`` (the NLL on
   the teachers' consensus at every task state that has one, not only where a pair exists), and the
   preference-loss candidates ``dpo_differing`` / ``dpo_first`` (the preference term over the tokens
   where chosen and rejected differ / over the first of them only). Same steps per arm;
7. held-out probe by greedy decoding, per state kind (:data:`STATE_KINDS`: the request, after a decoy
   read of *another* file, after an error, after the first / second read of the target); the score is
   ``combined`` = min(reading an unread target, editing a once-read one) on the decisive kinds (where the
   agents split 50/50), so always reading or always editing scores 0; prompts are cut at 320 tokens,
   where every held-out request is still visible. Every answer's ``parse_rate`` (greedy answers that
   parse as an action) and failures by reason are recorded too: a preference term can break the format.

Out (under ``--out``): each arm × seed *cell* in ``cells/`` when it is done (row, curve, per-state
outputs); a re-run with the same settings skips finished cells and ``budget_minutes`` stops between
cells. From all cells: ``results.jsonl``, ``per_kind.jsonl`` (seed × arm × state kind),
``states.jsonl`` (seed × arm × held-out state, with the answer's full text), ``table.md`` (per-kind shares, paired 95% intervals
against the start and between each arm and its control), ``curves.json`` / ``curves.png``.
The sessions are fixed; the seeds vary the start policy's fitting and every arm's training.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from composer_pipeline.actions import Action, ActionOrder, ActionParseError, parse_action_text, parse_failure
from composer_pipeline.experiments.pretrain import pretrain_base
from composer_pipeline.experiments.rule_teacher import (
    MODEL_PREFIX,
    RuleTeacherServer,
    _calls,
    _text,
    is_error_result,
    rule_action,
    task_state,
)
from composer_pipeline.experiments.sessions import HELDOUT_SEED, ingest_sessions, write_sessions
from composer_pipeline.experiments.sft import supervise_on_agent_actions
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers
from composer_pipeline.train.config import LoraSection, TrainRecipe, Weights
from composer_pipeline.train.hints import HintTemplates
from composer_pipeline.train.modeling import load_policy, resolve_model_path


@dataclass(frozen=True)
class Arm:
    """One arm: channel weights ``(grpo, sdpo, dpo)`` (``weights.*``) through the normal trainer, plus what the
    controls change (the data it reads, the DPO β, the GRPO prompt order)."""

    weights: tuple[float, float, float]
    data: str = "train"  # train | error_sites (the hint channel's rows only) | shuffled_labels (chosen/rejected swapped at random)
    dpo_beta: float | None = (
        None  # None: the recipe's; 0.0: the sigmoid term is a constant ln 2 (no gradient), NLL alone
    )
    grpo_order: str = "error_sites_first"  # or "shuffled": a seeded shuffle (the control for the order)
    divergence: str = "jsd"  # the hint channel's loss (sdpo.divergence): jsd | taid | eopd

    # None: the recipe's dpo.preference_tokens; "all" | "differing": which tokens the preference term sums
    preference_tokens: str | None = None


ARMS: dict[str, Arm | None] = {
    "start": None,
    "grpo": Arm((1.0, 0.0, 0.0)),
    "grpo_shuffled": Arm((1.0, 0.0, 0.0), grpo_order="shuffled"),
    "sdpo": Arm((0.0, 1.0, 0.0), data="error_sites"),
    "sdpo_taid": Arm((0.0, 1.0, 0.0), data="error_sites", divergence="taid"),  # TAID instead of the JSD
    "sdpo_eopd": Arm((0.0, 1.0, 0.0), data="error_sites", divergence="eopd"),  # entropy-aware OPD instead
    "dpo": Arm((0.0, 0.0, 1.0)),  # RPO: preference term + dpo_sft_weight · NLL on the chosen answers
    "nll": Arm((0.0, 0.0, 1.0), dpo_beta=0.0),  # the same NLL on the same chosen answers, no preference term
    "dpo_shuffled": Arm((0.0, 0.0, 1.0), data="shuffled_labels"),  # same pairs, sides swapped at random (seeded)
    # the preference term over the tokens where chosen and rejected differ only (+ the same NLL)
    "dpo_differing": Arm((0.0, 0.0, 1.0), preference_tokens="differing"),
    # ... over the first differing token only (the decision; nothing after it is pushed down)
    "dpo_first": Arm((0.0, 0.0, 1.0), preference_tokens="first_differing"),
    # the NLL term on the teachers' consensus at every task state with one (pairs and positives), not
    # only where a pair exists: does selecting the states where the agent disagreed matter?
    "nll_all": Arm((0.0, 0.0, 1.0), data="consensus_all", dpo_beta=0.0),
    "all": Arm((1.0, 1.0, 1.0)),
}
# the teachers' entries: name -> variant (rule_teacher.VARIANTS). `rule-copy` sends the same model as
# `rule`: one model asked twice, which the pair code must count once (its distinct-model rule)
TEACHERS: dict[str, str] = {
    "rule": "rule",
    "rule-copy": "rule",
    "noisy-1": "noisy-1",
    "noisy-2": "noisy-2",
    "writer": "writer",
}
# held-out state kinds (where the latest request stands, and what the last turn was); the decisive
# ones are those where the agents split 50/50, so a policy imitating them is at chance there
STATE_KINDS = ("request", "after_decoy", "after_error", "after_first_read", "after_second_read")
DECISIVE_READ = ("request", "after_decoy")  # target unread: Read it
DECISIVE_EDIT = ("after_first_read",)  # target read once: Edit it


@dataclass(frozen=True)
class ExperimentConfig:
    out: Path
    model: str = "tiny"  # tiny | local:smollm2-135m-instruct | a path
    seeds: int = 3
    steps: int = 60  # trainer steps per arm
    train_sessions: int = 48
    heldout_sessions: int = 40  # ~80 unread and ~60 read probe states: one state moves a share by < 0.02
    sft_steps: int = 200
    sft_lr: float = 1e-3
    # policy prompts keep their last N tokens (fitting, arms, probes): 320 keeps the request visible at
    # every held-out state (at 160 it was cut off at 36 of 64 read states: bench/RESULTS.md)
    prompt_tokens: int = 320
    pretrain_sessions: int = 600  # --model tiny: generated pretrain-split sessions the base model reads
    pretrain_steps: int = 2400  # --model tiny: steps training it from scratch (experiments.pretrain)
    learning_rate: float = 3e-4  # arms
    eval_every: int = 20
    lora: bool = False
    arms: tuple[str, ...] = ("start", "grpo", "grpo_shuffled", "sdpo", "dpo", "nll", "dpo_shuffled", "all")
    # the hinted teacher of the sdpo channel: the frozen start policy (a teacher that moves with the
    # student let this tiny model collapse, teacher and student agreeing on one broken answer: bench/RESULTS.md)
    hint_teacher: str = "initial"
    # RPO's NLL term on the chosen answers beside the DPO loss (plain DPO broke this tiny model's output
    # format within 60 steps: the margin grew by pushing both answers down)
    dpo_sft_weight: float = 1.0
    # the tokens the preference term sums in every DPO arm that does not set its own (dpo, dpo_shuffled,
    # all): None = the recipe's dpo.preference_tokens; all | differing | first_differing
    preference_tokens: str | None = None
    # the tool calls' key order in every completion text of the chain (render.action_order): the base
    # model's corpus, template and windows, the start fit, the pairs, hints and GRPO targets
    action_order: ActionOrder = "sorted"
    max_new_tokens: int = 96  # probes and rollouts: a whole Edit call with the tiny tokenizer (~80)
    probe_states: str = "all"  # all | decisive (only the decisive kinds: cheaper for a large model)
    budget_minutes: float | None = None  # stop cleanly before the next cell once spent (a re-run resumes)
    # which seeds this process runs, in this order (default: 0 .. seeds-1); a second process on the same
    # --out over other seeds shares the finished cells (each cell is re-checked before it is run)
    only_seeds: tuple[int, ...] | None = None

    @classmethod
    def quick(cls, out: Path, **kw) -> ExperimentConfig:
        """Tiny model, one seed, small sizes (≤ 10 minutes on 2 CPU cores)."""
        base: dict[str, Any] = dict(
            model="tiny",
            seeds=1,
            steps=20,
            train_sessions=40,
            heldout_sessions=12,
            sft_steps=150,
            sft_lr=1e-3,
            learning_rate=3e-4,
            eval_every=10,
            pretrain_steps=500,
            arms=("start", "grpo", "sdpo", "dpo", "nll", "dpo_shuffled", "all"),
        )
        base.update({k: v for k, v in kw.items() if v is not None})
        return cls(out=out, **base)

    @classmethod
    def smollm2(cls, out: Path, **kw) -> ExperimentConfig:
        """SmolLM2-135M-Instruct at sizes for a CPU (about 2.2 h on two free cores, bench/RESULTS.md): a
        40-step start fit, 30 steps per arm, probes at start/middle/end on the decisive states only,
        ≤ 72 new tokens, LoRA off (135M fits), prompts of 384 tokens (its tokenizer splits paths finer)."""
        base: dict[str, Any] = dict(
            model="local:smollm2-135m-instruct",
            seeds=3,
            steps=30,
            sft_steps=40,
            sft_lr=1e-4,
            learning_rate=3e-5,
            eval_every=15,
            heldout_sessions=24,
            max_new_tokens=72,
            probe_states="decisive",
            prompt_tokens=384,
            # the pre-registered table (bench/RESULTS.md, "SmolLM2: the plan"): primary contrasts dpo − nll
            # and nll − nll_all
            arms=("start", "nll", "dpo", "nll_all", "dpo_shuffled"),
        )
        base.update({k: v for k, v in kw.items() if v is not None})
        return cls(out=out, **base)

    def fingerprint(self) -> dict[str, Any]:
        """What a finished cell depends on: a re-run with other values cannot reuse the cells (seeds,
        arms and the budget may change: they only say which cells to run)."""
        d = {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if k not in ("out", "seeds", "arms", "budget_minutes", "only_seeds")
        }
        if self.action_order == "sorted":  # (absent: run dirs made before the setting stay resumable)
            del d["action_order"]
        # version 5: pairs whose chosen side repeats the prompt's last call are dropped, and every cell
        # records parse_rate and the answers' full texts (issue 31): cells of version 4 do not mix with these
        return {**d, "heldout_seed": HELDOUT_SEED, "teachers": TEACHERS, "version": 5}


# -- data: sessions -> ingest -> replay -> pairs ---------------------------------------------------
def _task_state_ids(store_root: Path) -> set[str]:
    """States whose prompt holds a file request (the rule has an answer there)."""
    from composer_pipeline.train.data import load_train_data

    data = load_train_data(str(store_root), heldout_fraction=0.0, hints=HintTemplates())
    return {p.state_id for p in data.prompts if rule_action(p.messages) is not None}


def build_data(work: Path, cfg: ExperimentConfig) -> dict[str, Any]:
    """Sessions -> ingest -> replay (rule teachers over HTTP) -> pairs. Returns the store roots and counts
    (reused from ``info.json`` when a run with the same settings built them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from composer_pipeline import render, tables
    from composer_pipeline.ledger import Ledger
    from composer_pipeline.pairs.build import PairRecipe, build_pairs
    from composer_pipeline.pairs.normalize import NormalizeRecipe, normalize_pairs
    from composer_pipeline.replay.report import cli_legacy_keys
    from composer_pipeline.replay.run import ReplayRun
    from composer_pipeline.store import Store

    info_path = work / "info.json"
    sizes = {
        "train_sessions": cfg.train_sessions,
        "heldout_sessions": cfg.heldout_sessions,
        "heldout_seed": HELDOUT_SEED,
        "teachers": TEACHERS,
    }
    if cfg.action_order != "sorted":
        sizes["action_order"] = cfg.action_order
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("sizes") == sizes:
            return _resolve_stores(info, work)
    repo = Path(__file__).resolve().parents[2]
    train_plans = write_sessions(work / "sessions" / "train", cfg.train_sessions, "train", seed=0)
    # a seed range no design round has looked at (runs 1-3 used seed 0 for both splits)
    held_plans = write_sessions(work / "sessions" / "heldout", cfg.heldout_sessions, "heldout", seed=HELDOUT_SEED)
    train_root, heldout_root = work / "train_store", work / "heldout_store"
    counts = {
        "train": ingest_sessions(work / "sessions" / "train", train_root),
        "heldout": ingest_sessions(work / "sessions" / "heldout", heldout_root),
    }
    store = Store(str(train_root))
    states, messages = store.read_table("trace_states"), store.read_table("trace_messages")
    task = _task_state_ids(train_root)
    task_states = states.filter(pc.is_in(states["state_id"], value_set=pa.array(sorted(task))))
    with RuleTeacherServer() as srv:
        cfg_t = parse_teachers(
            {
                "ceiling_usd": 1.0,
                "teachers": [
                    # each variant stands in for a distinct strong API teacher, so each names its own model: the
                    # pair builder counts distinct models (base_url + model) as votes, not entry names
                    {
                        "name": n,
                        "base_url": srv.url,
                        "model": MODEL_PREFIX + v,
                        "api_key_env": None,
                        "input_usd_per_mtok": 0.01,
                        "output_usd_per_mtok": 0.02,
                        "budget_usd": 1.0,
                        "max_concurrency": 4,
                        "max_tokens": 256,
                        "temperature": 0.0,
                        "timeout_s": 30,
                        "max_retries": 2,
                    }
                    for n, v in TEACHERS.items()
                ],
            },
            "experiment",
        )
        opts = render.RenderOptions(action_order=cfg.action_order)
        ledger, cache = Ledger(work / "ledger.sqlite"), ResponseCache(work / "teacher_cache")
        run = ReplayRun.prepare(task_states, messages, cfg_t, opts)
        plan = run.plan(cache, ledger)
        if not plan.fits:
            raise RuntimeError(f"cost plan does not fit: {plan.reasons}")
        res = run.replay({n: None for n in TEACHERS}, cache=cache, ledger=ledger, run_id="read-before-edit")
        calls = srv.calls
    store.write_table("teacher_replays", res.table)
    pairs = build_pairs(
        task_states, messages, res.table, PairRecipe.load(repo / "recipes" / "pairs.yaml"), opts, teachers=cfg_t
    )
    norm = normalize_pairs(pairs.pairs, NormalizeRecipe.load(repo / "recipes" / "normalize.yaml"))
    store.write_table("dpo_pairs", pairs.pairs)
    store.write_table("pairs", norm.kept)
    store.write_table("positives", pairs.positives)
    store.write_table("dropped_pairs", pa.concat_tables([pairs.dropped, tables.conform(norm.dropped, "dropped_pairs")]))
    # the hint arm reads error sites only: a view of the same tables restricted to them, so that every
    # step's batch holds one (a step without any would have nothing to distill)
    err_ids = pa.array(sorted(set(states.filter(pc.field("has_error")).column("state_id").to_pylist())))
    hint_root = work / "error_site_store"
    hint_store = Store(str(hint_root))
    for name in ("trace_states", "pairs", "positives"):
        t = store.read_table(name)
        hint_store.write_table(name, t.filter(pc.is_in(t["state_id"], value_set=err_ids)))
    hint_store.write_table("trace_messages", messages)
    st = pairs.stats
    replay_counts = {**res.summary, **cli_legacy_keys(res.summary)}  # info.json keeps the names earlier runs wrote
    info = {
        "sizes": sizes,
        # relative to the data dir, so a run resumes from any working directory
        "train_store": train_root.name,
        "heldout_store": heldout_root.name,
        "error_site_store": hint_root.name,
        "error_sites": len(err_ids),
        "ingest": counts,
        "edit_first_sessions": sum(p.edit_first for p in train_plans),
        "train_sessions": len(train_plans),
        "detour_sessions": {
            "train": sum(p.detour is not None for p in train_plans),
            "heldout": sum(p.detour is not None for p in held_plans),
        },
        "task_states": len(task),
        "teacher_calls_http": calls,
        "replay": {k: replay_counts[k] for k in ("calls", "cache_hits", "answered", "failed", "total_spend")},
        "pairs": norm.kept.num_rows,
        "pair_kinds": _pair_kinds(norm.kept),
        "positives": pairs.positives.num_rows,
        "dropped": norm.dropped.num_rows + pairs.dropped.num_rows,
        # how the teachers agreed: states with a cross-model consensus, tied, with none; answers of one
        # model asked twice (counted once)
        "consensus": {
            "cross_model": st["states_cross_model"],
            "self_consistency": st["states_self_consistency"],
            "tied": st["states_tied"],
            "no_consensus": st["states_no_consensus"],
            "greedy_duplicates": st["answers_greedy_duplicates"],
            "agreeing_models": _agreeing_models(pairs.pairs, pairs.positives),
        },
    }
    info_path.write_text(json.dumps(info, indent=1))
    return _resolve_stores(info, work)


_STORES = ("train_store", "heldout_store", "error_site_store")


def _resolve_stores(info: dict[str, Any], work: Path) -> dict[str, Any]:
    """``info.json``'s store paths as paths to open: relative ones are under ``work`` (runs made
    before 2026-11-26 wrote them relative to the working directory they ran in: kept when found there)."""
    out = dict(info)
    for k in _STORES:
        p = Path(info[k])
        out[k] = str(p if p.is_absolute() or (not (work / p).is_dir() and p.is_dir()) else work / p)
    return out


def _agreeing_models(*tables) -> dict[str, int]:
    """Rows per "k of n models" (the consensus' size among the distinct models that answered)."""
    out: dict[str, int] = {}
    for t in tables:
        for k, n in zip(t.column("n_models_agreeing").to_pylist(), t.column("n_models").to_pylist()):
            out[f"{k} of {n}"] = out.get(f"{k} of {n}", 0) + 1
    return dict(sorted(out.items()))


def shuffled_label_store(train_root: str, out_root: Path, seed: int) -> str:
    """A copy of the train store whose pairs have chosen and rejected swapped at a seeded random half
    of the rows (same prompts, same answers): the DPO arm's control for "the labels carry it"."""

    import pyarrow as pa

    from composer_pipeline.store import Store

    if (out_root / "pairs.parquet").is_file():
        return str(out_root)
    src, dst = Store(train_root), Store(str(out_root))
    pairs = src.read_table("pairs")
    rng = random.Random(f"shuffled-labels|{seed}")
    swap = [rng.random() < 0.5 for _ in range(pairs.num_rows)]
    cols = {}
    for a, b in (("chosen", "rejected"), ("chosen_text", "rejected_text")):
        xa, xb = pairs.column(a).to_pylist(), pairs.column(b).to_pylist()
        cols[a] = [y if s else x for x, y, s in zip(xa, xb, swap)]
        cols[b] = [x if s else y for x, y, s in zip(xa, xb, swap)]
    for name, vals in cols.items():
        pairs = pairs.set_column(
            pairs.schema.get_field_index(name), name, pa.array(vals, pairs.schema.field(name).type)
        )
    for name in ("trace_states", "trace_messages", "positives"):
        dst.write_table(name, src.read_table(name))
    dst.write_table("pairs", pairs)
    return str(out_root)


def consensus_store(train_root: str, out_root: Path, order: ActionOrder = "sorted") -> str:
    """A copy of the train store whose ``pairs`` hold the teachers' consensus as the chosen side at every
    task state that has one: the pairs, plus each positive (the agent agreed with the consensus) as a row
    whose rejected side is an empty-text stand-in. For the ``nll_all`` arm only, whose preference term is a
    constant (β 0): the rejected side never reaches a gradient, the NLL reads every consensus answer."""
    import pyarrow as pa

    from composer_pipeline import tables
    from composer_pipeline.store import Store

    if (out_root / "pairs.parquet").is_file():
        return str(out_root)
    src, dst = Store(train_root), Store(str(out_root))
    stand_in = Action(text="(no rejected answer: the agent agreed with the consensus)")
    rows = src.read_table("pairs").to_pylist()
    for r in src.read_table("positives").to_pylist():
        rows.append(
            {
                **r,
                "kind": "pair",
                "pair_id": r.get("pair_id") or f"positive-{r['state_id']}",
                "rejected": stand_in.to_json(),
                "rejected_text": stand_in.to_text(order),
            }
        )
    dst.write_table("pairs", tables.conform(pa.Table.from_pylist(rows), "normalized_dpo_pairs"))
    for name in ("trace_states", "trace_messages"):
        if src.exists(name):
            dst.write_table(name, src.read_table(name))
    return str(out_root)


def _pair_kinds(pairs) -> dict[str, int]:
    """How many pairs prefer which tool over which (``"Read over Edit"``): both directions are needed,
    or DPO learns "always X" instead of the rule."""

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
    kind: str  # unread | read (the target's state: Read is right / Edit is right)
    path: str
    state: str = ""  # one of STATE_KINDS: where the latest request stands and what the last turn was
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
        kind = state_kind(p.messages)
        if kind is None or (states == "decisive" and kind not in DECISIVE_READ + DECISIVE_EDIT):
            continue
        st = task_state(p.messages)
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
    parsed = [o["parsed"] for o in outputs if "parsed" in o]  # cells written before 2026-11-27 lack it
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
                        "hit": int(tool_hit and first.arguments.get("file_path") == c.path),
                        # the whole answer, and whether it parses as an action (else why not)
                        "text": text,
                        "parsed": int(failure is None),
                        "parse_error": failure,
                    }
                )
    model.train(was_training)
    return {**score_outputs(outputs), "outputs": outputs}


def _probe_callback(tokenizer, cases, every: int, curve: list[dict], max_new_tokens: int = 96):
    from transformers import TrainerCallback

    class ProbeEvery(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if model is not None and state.global_step % every == 0:
                m = probe(model, tokenizer, cases, max_new_tokens=max_new_tokens)
                curve.append({"step": state.global_step, **{k: v for k, v in m.items() if k != "outputs"}})

    return ProbeEvery()


# -- arms -----------------------------------------------------------------------------------------------
def arm_recipe(base, arm: str, cfg: ExperimentConfig, start: Path, seed: int):
    spec = ARMS[arm]
    grpo, sdpo, dpo_weight = spec.weights  # type: ignore[union-attr]
    r = replace(base, model=str(start), weights=Weights(grpo=grpo, sdpo=sdpo, dpo=dpo_weight))
    dpo = replace(r.dpo, max_completion_tokens=cfg.max_new_tokens, sft_weight=cfg.dpo_sft_weight)
    if spec.dpo_beta is not None:
        dpo = replace(dpo, beta=spec.dpo_beta)
    tokens = spec.preference_tokens or cfg.preference_tokens
    if tokens is not None:
        dpo = replace(dpo, preference_tokens=tokens)
    r = replace(
        r,
        optim=replace(r.optim, steps=cfg.steps, seed=seed, learning_rate=cfg.learning_rate),
        data=replace(
            r.data, heldout_fraction=0.0, max_prompt_tokens=cfg.prompt_tokens, render_recipe=render_recipe(cfg)
        ),
        # 96 tokens hold a whole Edit call (~80 with the tiny tokenizer): a shorter limit cuts every
        # Edit rollout into an unparseable one and so rewards reading everywhere
        grpo=replace(
            r.grpo,
            max_completion_length=cfg.max_new_tokens,
            num_generations=4,
            prompts_per_step=2,
            data_order=spec.grpo_order,
        ),
        dpo=dpo,
        sdpo=replace(r.sdpo, teacher=cfg.hint_teacher, divergence=spec.divergence),
        lora=LoraSection(enabled=cfg.lora, r=16, alpha=32) if cfg.lora else r.lora,
    )
    return r


def render_recipe(cfg: ExperimentConfig) -> str | None:
    """The render recipe the trainer reads (``data.render_recipe``) for ``cfg.action_order``: None for the
    default, else ``<out>/render.yaml`` (written here) holding that order."""
    if cfg.action_order == "sorted":
        return None
    path = Path(cfg.out) / "render.yaml"
    text = f"render:\n  action_order: {cfg.action_order}\n"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def _check_run_dir(out: Path, cfg: ExperimentConfig) -> None:
    """A re-run may resume an out dir only with the same settings (other seeds / arms are fine)."""
    run = out / "run.json"
    fp = json.loads(json.dumps(cfg.fingerprint(), default=str))
    if run.is_file():
        old = json.loads(run.read_text())
        diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
        if diff:
            raise ValueError(
                f"{out} holds cells of a run with other settings ({', '.join(diff)}): "
                f"use another --out, or delete {out} to start over"
            )
    else:
        run.write_text(json.dumps(fp, indent=1))


def _cell_path(out: Path, seed: int, arm: str) -> Path:
    return out / "cells" / f"seed{seed}-{arm}.json"


def _finished_start_probe(out: Path, seed: int) -> dict[str, Any] | None:
    """The start policy's probe as its finished ``start`` cell recorded it (metrics and outputs), if any."""
    cell = _cell_path(out, seed, "start")
    if not cell.is_file():
        return None
    done = json.loads(cell.read_text())
    cell_keys = ("arm", "seed", "steps", "seconds")
    return {**{k: v for k, v in done["row"].items() if k not in cell_keys}, "outputs": done["outputs"]}


def run_experiment(cfg: ExperimentConfig, emit=print) -> dict[str, Any]:
    """Every arm × seed cell is written to ``cells/`` when done; a re-run with the same settings skips
    finished cells; with ``budget_minutes`` it stops before a cell once the budget is spent."""
    from composer_pipeline.train.data import load_train_data

    _check_config(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    _check_run_dir(out, cfg)
    t0 = time.perf_counter()
    over_budget = lambda: cfg.budget_minutes is not None and time.perf_counter() - t0 > 60 * cfg.budget_minutes  # noqa: E731
    data_info = build_data(out / "data", cfg)
    emit(json.dumps({"data": data_info}))
    repo = Path(__file__).resolve().parents[2]
    base = TrainRecipe.load(repo / "recipes" / "train.yaml")
    train_rows = load_train_data(
        data_info["train_store"], heldout_fraction=0.0, hints=base.sdpo.hint, render_recipe=render_recipe(cfg)
    ).prompts
    base_model = _base_model(cfg, out, base, emit)
    stopped = None
    for seed in cfg.only_seeds if cfg.only_seeds is not None else range(cfg.seeds):
        todo = [arm for arm in cfg.arms if not _cell_path(out, seed, arm).is_file()]
        for arm in cfg.arms:
            if arm not in todo:
                emit(json.dumps({**json.loads(_cell_path(out, seed, arm).read_text())["row"], "resumed": True}))
        if not todo:
            continue
        if over_budget():
            stopped = {"stopped": "budget", "budget_minutes": cfg.budget_minutes, "before": f"seed {seed}"}
            break
        ts = time.perf_counter()
        start = out / f"seed{seed}" / "start"
        if not (start / "config.json").is_file():
            supervise_on_agent_actions(
                base_model,
                train_rows,
                start,
                steps=cfg.sft_steps,
                seed=seed,
                lr=cfg.sft_lr,
                max_prompt_tokens=cfg.prompt_tokens,
                max_completion_tokens=cfg.max_new_tokens,
                action_order=cfg.action_order,
            )
        tok, start_model = load_policy(str(start))
        cases = heldout_cases(data_info["heldout_store"], tok, cfg.prompt_tokens, cfg.probe_states)
        start_metrics = _finished_start_probe(out, seed)  # greedy: probing the same weights again gives the same
        if start_metrics is None:
            start_metrics = probe(start_model, tok, cases, max_new_tokens=cfg.max_new_tokens)
        del start_model
        sft_s = time.perf_counter() - ts
        for arm in todo:
            if _cell_path(out, seed, arm).is_file():  # finished meanwhile by another process (--only-seeds)
                continue
            if arm != todo[0] and over_budget():
                stopped = {"stopped": "budget", "budget_minutes": cfg.budget_minutes, "before": f"seed {seed} {arm}"}
                break
            ta = time.perf_counter()
            curve = [{"step": 0, **{k: v for k, v in start_metrics.items() if k != "outputs"}}]
            if ARMS[arm] is None:
                metrics, steps = start_metrics, 0
            else:
                metrics, steps = _train_arm(arm, cfg, base, start, seed, data_info, (tok, cases, curve))
            row = {
                "arm": arm,
                "seed": seed,
                **{k: v for k, v in metrics.items() if k != "outputs"},
                "steps": steps,
                "seconds": round(time.perf_counter() - ta + (sft_s if arm == "start" else 0.0), 1),
            }
            _write_cell(_cell_path(out, seed, arm), {"row": row, "curve": curve, "outputs": metrics["outputs"]})
            emit(json.dumps(row))
        if stopped:
            break
    if stopped:
        emit(json.dumps(stopped))
    return {
        **collect(out, cfg),
        "seconds": time.perf_counter() - t0,
        "data": data_info,
        "out": str(out),
        "stopped": stopped,
    }


def _check_config(cfg: ExperimentConfig) -> None:
    """The experiment's cross-setting rules: known arms, an NLL weight for the NLL arms, a known probe set."""
    unknown = set(cfg.arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {list(ARMS)}")
    if {"nll", "nll_all"} & set(cfg.arms) and not cfg.dpo_sft_weight > 0:
        raise ValueError("the nll and nll_all arms are the NLL term alone: they need --dpo-sft-weight > 0")
    if cfg.probe_states not in ("all", "decisive"):
        raise ValueError(f"probe_states must be all or decisive, got {cfg.probe_states!r}")


def _base_model(cfg: ExperimentConfig, out: Path, base, emit) -> str:
    """The model every seed's start is supervised from: ``cfg.model``, or for ``tiny`` one pretrained here."""

    if cfg.model != "tiny":
        return resolve_model_path(cfg.model)
    # trained from scratch on other generated sessions first (every file pair, no held-out request)

    base_model = str(
        pretrain_base(
            out / "base",
            sessions=cfg.pretrain_sessions,
            steps=cfg.pretrain_steps,
            max_tokens=cfg.prompt_tokens,
            hint_templates=base.sdpo.hint,
            action_order=cfg.action_order,
        )
    )
    meta = json.loads((out / "base" / "pretrain.json").read_text())
    emit(
        json.dumps(
            {
                "base": {
                    **meta["settings"],
                    "windows": meta["windows"],
                    "seconds": meta["seconds"],
                    "final_loss": meta["curve"][-1]["loss"],
                }
            }
        )
    )
    return base_model


def _train_arm(arm: str, cfg: ExperimentConfig, base, start: Path, seed: int, data_info: dict, probing: tuple):
    """Train one arm from the seed's start on the data it reads and probe the result: ``(metrics, steps)``.
    ``probing``: (tokenizer, held-out cases, the curve the probe callback appends to)."""
    from composer_pipeline.train.run import train

    tok, cases, curve = probing
    out = Path(cfg.out)
    recipe = arm_recipe(base, arm, cfg, start, seed)
    spec = ARMS[arm]
    root = {"train": data_info["train_store"], "error_sites": data_info["error_site_store"]}.get(spec.data)
    if spec.data == "consensus_all":
        root = consensus_store(data_info["train_store"], out / "consensus_store", cfg.action_order)
    if spec.data == "shuffled_labels":
        root = shuffled_label_store(data_info["train_store"], out / f"seed{seed}" / "shuffled_label_store", seed)
    res = train(
        root,
        recipe,
        out_dir=out / f"seed{seed}" / arm,
        callbacks=[_probe_callback(tok, cases, cfg.eval_every, curve, cfg.max_new_tokens)],
    )
    tok2, final = load_policy(str(res.checkpoint))
    metrics = probe(final, tok2, cases, max_new_tokens=cfg.max_new_tokens)
    del final
    if curve[-1]["step"] != cfg.steps:
        curve.append({"step": cfg.steps, **{k: v for k, v in metrics.items() if k != "outputs"}})
    steps = len(res.losses)
    return metrics, steps


def _write_cell(path: Path, cell: dict) -> None:
    """The cell: its row, its curve and its per-state outputs, written at once when it is done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cell))
    tmp.replace(path)


def collect(out: Path, cfg: ExperimentConfig | None = None) -> dict[str, Any]:
    """Every finished cell under ``out`` -> ``results.jsonl`` (one row per arm × seed),
    ``per_kind.jsonl`` (one line per seed × arm × state kind), ``states.jsonl`` (one line per
    held-out state × arm × seed), ``curves.json``/``curves.png`` and ``table.md``."""
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("seed*.json"))]
    order = {a: i for i, a in enumerate(cfg.arms if cfg else ARMS)}
    cells.sort(key=lambda c: (c["row"]["seed"], order.get(c["row"]["arm"], 99)))
    results = [c["row"] for c in cells]
    with (out / "results.jsonl").open("w") as f:
        for r in results:
            f.write(json.dumps({k: v for k, v in r.items() if k != "kinds"}) + "\n")
    with (out / "per_kind.jsonl").open("w") as f:
        for r in results:
            for kind, v in r["kinds"].items():
                f.write(json.dumps({"seed": r["seed"], "arm": r["arm"], "kind": kind, **v}) + "\n")
    with (out / "states.jsonl").open("w") as f:
        for c in cells:
            for o in c["outputs"]:
                f.write(
                    json.dumps(
                        {
                            "seed": c["row"]["seed"],
                            "arm": c["row"]["arm"],
                            "state_id": o["state_id"],
                            "state": o["state"],
                            "hit": o["hit"],
                            "tool_hit": o["tool_hit"],
                            "answer": o["answer"],
                            "parsed": o.get("parsed"),
                            "parse_error": o.get("parse_error"),
                            "text": o.get("text"),
                        },
                        separators=(",", ":"),
                    )
                    + "\n"
                )
    curves: dict[str, list] = {}
    for c in cells:
        curves.setdefault(c["row"]["arm"], []).append(c["curve"])
    (out / "curves.json").write_text(json.dumps(curves))
    table = summary_table(results) if results else "(no finished cells)"
    (out / "table.md").write_text(table + "\n")
    if results:
        plot_curves(curves, out / "curves.png")
    return {"results": results, "table": table}


def _mean_std(xs: list[float], *, signed: bool = False, digits: int = 3) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return f"{m:{'+' if signed else ''}.{digits}f} ± {sd:.{digits}f}"


# two-sided 95% quantiles of Student's t by degrees of freedom (any statistics table, e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, 1.3.6.7.2); beyond 30 the normal 1.96
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def paired_interval(diffs: list[float]) -> tuple[float, float, float] | None:
    """Mean of per-seed differences and its 95% t interval ``(mean, low, high)``; None under 2 seeds."""
    n = len(diffs)
    if n < 2:
        return None
    m = sum(diffs) / n
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1))
    t = _T975.get(n - 1) or next((v for k, v in sorted(_T975.items()) if k >= n - 1), 1.96)
    half = t * sd / math.sqrt(n)
    return m, m - half, m + half


def _fmt_interval(iv: tuple[float, float, float] | None, n: int) -> str:
    if iv is None:
        return f"n/a ({n} seed{'s' if n != 1 else ''})"
    return f"{iv[0]:+.3f} [{iv[1]:+.3f}, {iv[2]:+.3f}]"


# the comparisons the controls exist for: (arm, control) -> what a difference that excludes 0 says
CONTRASTS = [
    ("dpo", "nll", "the preference term adds to the NLL on the chosen answers"),
    ("dpo_differing", "nll", "the preference term over the differing tokens adds to the NLL"),
    ("dpo_differing", "dpo", "summing the preference term over the differing tokens only matters"),
    ("dpo_first", "nll", "the preference term on the first differing token adds to the NLL"),
    ("nll", "nll_all", "selecting the states where the agent disagreed matters (vs the consensus everywhere)"),
    ("dpo", "dpo_shuffled", "the pairs' labels carry the DPO gain"),
    ("grpo", "grpo_shuffled", "the error-sites-first order matters to GRPO"),
    ("all", "dpo", "GRPO + hint-SDPO add to DPO"),
    ("dpo", "grpo", "DPO beats GRPO at the same steps"),
]


def _paired(results: list[dict], a: str, b: str, key: str = "combined") -> list[float]:
    by = {(r["arm"], r["seed"]): r.get(key) for r in results}
    return [
        by[(a, s)] - by[(b, s)]
        for (arm, s) in sorted(by)
        if arm == a and by.get((b, s)) is not None and by[(a, s)] is not None
    ]


def summary_table(results: list[dict]) -> str:
    """Per arm: the combined score on the decisive states (min of reading an unread target, editing a
    once-read one), its change from the start policy *of the same seed* with a 95% paired t interval,
    and the exact-hit share per state kind; then the controls' paired contrasts and the winner."""
    arms = list(dict.fromkeys(r["arm"] for r in results))
    head = (
        "| arm | seeds | combined (decisive) | Δ combined vs start [95% CI] | decisive read | decisive edit | parse rate | "
        + " | ".join(k.replace("_", " ") for k in STATE_KINDS)
        + " | steps | seconds |"
    )
    lines = [head, "|" + "---|" * (9 + len(STATE_KINDS))]
    for arm in arms:
        rs = [r for r in results if r["arm"] == arm]
        d = "—" if arm == "start" else _fmt_interval(paired_interval(_paired(results, arm, "start")), len(rs))
        kinds = " | ".join(
            _mean_std([(r.get("kinds") or {}).get(k, {}).get("hit") for r in rs], digits=2) for k in STATE_KINDS
        )
        lines.append(
            f"| {arm} | {len(rs)} | {_mean_std([r.get('combined') for r in rs])} | {d} "
            f"| {_mean_std([r.get('decisive_read') for r in rs], digits=2)} | {_mean_std([r.get('decisive_edit') for r in rs], digits=2)} "
            f"| {_mean_std([r.get('parse_rate') for r in rs], digits=2)} | {kinds} | {rs[0]['steps']} | {_mean_std([r['seconds'] for r in rs], digits=0)} |"
        )
    contrasts = [(a, b, why) for a, b, why in CONTRASTS if a in arms and b in arms]
    if contrasts:
        lines += [
            "",
            "| contrast (combined, paired over seeds) | seeds | mean [95% CI] | reading if the interval excludes 0 |",
            "|---|---|---|---|",
        ]
        for a, b, why in contrasts:
            ds = _paired(results, a, b)
            lines.append(f"| {a} − {b} | {len(ds)} | {_fmt_interval(paired_interval(ds), len(ds))} | {why} |")
    means = {a: [r["combined"] for r in results if r["arm"] == a and r.get("combined") is not None] for a in arms}
    means = {a: sum(v) / len(v) for a, v in means.items() if v}
    if len(means) > 1:
        best = max(means, key=means.get)
        beaten = []
        for other in sorted(means, key=means.get, reverse=True)[1:]:
            iv = paired_interval(_paired(results, best, other))
            beaten.append(f"{other} {_fmt_interval(iv, 0)}" + ("" if iv is None or iv[1] > 0 else " (not excluded 0)"))
        lines += [
            "",
            f"Highest mean combined: **{best}** ({means[best]:.3f}); paired differences: " + "; ".join(beaten),
        ]
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
