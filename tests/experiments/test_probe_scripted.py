"""The held-out probe, checked with scripted policies on the experiment's real held-out set (seconds).

A scripted model stands in for the policy (``generate`` decides from the rendered prompt text), so
what is tested is ``probe()`` and the held-out set, not a network: always-Read, always-Edit and
"decide from the last message" must score exactly what they must per state kind, and the combined
score must be 0 for a policy that always takes one tool. Always-Read scoring 1.0 at every unread
state also shows that the request (the path to copy) is visible in every cut prompt.
"""

from __future__ import annotations

import re

import pytest
import torch

from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.experiments.pretrain import _session_text
from composer_pipeline.experiments.read_before_edit.config import ExperimentConfig
from composer_pipeline.experiments.read_before_edit.probe import (
    DECISIVE_EDIT,
    DECISIVE_READ,
    STATE_KINDS,
    heldout_cases,
    probe,
)
from composer_pipeline.experiments.sessions import HELDOUT_SEED, ingest_sessions, write_sessions
from composer_pipeline.tiny_model import build_tokenizer

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)
_PATH = re.compile(r"(/[\w.\-]+(?:/[\w.\-]+)*\.\w+)")


def _visible_request_path(prompt: str) -> str | None:
    users = [body for role, body in _TURN.findall(prompt) if role == "user" and _PATH.search(body)]
    return _PATH.search(users[-1]).group(1) if users else None


def _last_turn(prompt: str) -> tuple[str, str]:
    turns = _TURN.findall(prompt)
    return turns[-1] if turns else ("", "")


def always_read(prompt: str) -> Action:
    path = _visible_request_path(prompt)
    return Action(tool_calls=(ToolCall("Read", {"file_path": path}, "c"),)) if path else Action(text="?")


def always_edit(prompt: str) -> Action:
    path = _visible_request_path(prompt)
    return (
        Action(tool_calls=(ToolCall("Edit", {"file_path": path, "old_string": "A = 1", "new_string": "A = 2"}, "c"),))
        if path
        else Action(text="?")
    )


def last_message(prompt: str) -> Action:
    """Edit when the last turn is a tool result that is not an error (whatever file it was), else Read."""
    role, body = _last_turn(prompt)
    ok_result = role == "tool" and "tool_use_error" not in body and not body.startswith("Error:")
    return always_edit(prompt) if ok_result else always_read(prompt)


class ScriptedLM:
    """Just enough of a causal LM for ``probe()``: greedy ``generate`` returns the policy's action text."""

    def __init__(self, tokenizer, policy):
        self.tok, self.policy, self.training, self.device = tokenizer, policy, True, torch.device("cpu")

    def eval(self):
        self.training = False
        return self

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):
        outs = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = self.tok.decode([i for i, m in zip(ids, mask) if m])
            text = self.policy(prompt).to_text() + self.tok.eos_token
            outs.append(self.tok(text, add_special_tokens=False)["input_ids"][:max_new_tokens])
        w = max(map(len, outs))
        return torch.cat([input_ids, torch.tensor([o + [pad_token_id] * (w - len(o)) for o in outs])], dim=1)


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    """The experiment's held-out set at its real size and seed, rendered at its prompt length."""
    cfg = ExperimentConfig(out=tmp_path_factory.mktemp("unused"))
    root = tmp_path_factory.mktemp("heldout")
    write_sessions(root / "sessions", cfg.heldout_sessions, "heldout", seed=HELDOUT_SEED)
    write_sessions(root / "pretrain", 120, "pretrain", seed=1000)
    ingest_sessions(root / "sessions", root / "store")
    tok = build_tokenizer(1024, _session_text(root / "pretrain"), path_words=True)
    cases = heldout_cases(str(root / "store"), tok, cfg.prompt_tokens)
    return tok, cases


def _run(tok, cases, policy):
    return probe(ScriptedLM(tok, policy), tok, cases, max_new_tokens=120)


def test_heldout_set_has_every_state_kind_and_decoys_as_last_turn(heldout):
    tok, cases = heldout
    n = {k: sum(c.state == k for c in cases) for k in STATE_KINDS}
    assert all(v > 0 for v in n.values()), n
    assert sum(n.values()) == len(cases)
    for c in cases:
        # the last turn read *another* file of the same directory
        if c.state == "after_decoy":
            role, body = _last_turn(c.prompt)
            assert role == "tool" and c.path not in body
            assert re.search(r'"name": ?"Read"', c.prompt.rsplit("<|im_start|>assistant", 2)[-2]) and c.kind == "unread"


def test_scripted_policies_score_exactly_what_they_must(heldout):
    tok, cases = heldout
    n = {k: sum(c.state == k for c in cases) for k in STATE_KINDS}

    r = _run(tok, cases, always_read)
    assert {k: v["hit"] for k, v in r["kinds"].items()} == {
        "request": 1.0,
        "after_decoy": 1.0,
        "after_error": 1.0,
        "after_first_read": 0.0,
        "after_second_read": 0.0,
    }
    assert (r["read_when_unread"], r["edit_when_read"], r["combined"]) == (1.0, 0.0, 0.0)
    assert r["n_unread"] + r["n_read"] == len(cases) and len(r["outputs"]) == len(cases)

    e = _run(tok, cases, always_edit)
    assert (e["read_when_unread"], e["edit_when_read"], e["decisive_edit"], e["combined"]) == (0.0, 1.0, 1.0, 0.0)

    # deciding from the last message alone: right everywhere except after a decoy read of another file
    m = _run(tok, cases, last_message)
    assert {k: v["hit"] for k, v in m["kinds"].items()} == {
        "request": 1.0,
        "after_decoy": 0.0,
        "after_error": 1.0,
        "after_first_read": 1.0,
        "after_second_read": 1.0,
    }
    assert m["decisive_read"] == n["request"] / (n["request"] + n["after_decoy"])
    assert m["combined"] == m["decisive_read"] < 1.0
    assert {o["state"] for o in m["outputs"] if not o["hit"]} == {"after_decoy"}


def test_the_rule_itself_scores_one_and_a_wrong_path_scores_zero(heldout):
    tok, cases = heldout
    # the prompt as the scripted model sees it (decoded from its token ids) -> its case
    by_prompt = {tok.decode(tok(c.prompt, add_special_tokens=False)["input_ids"]): c for c in cases}

    def rule(prompt):
        c = by_prompt[prompt]
        return always_read(prompt) if c.kind == "unread" else always_edit(prompt)

    # the right tool on a file of the same name in another directory
    def wrong_path(prompt):
        a = rule(prompt)
        call = a.tool_calls[0]
        return Action(
            tool_calls=(
                ToolCall(
                    call.name,
                    {**call.arguments, "file_path": call.arguments["file_path"].replace("/app/", "/app/x/")},
                    "c",
                ),
            )
        )

    ok = _run(tok, cases, rule)
    assert ok["combined"] == ok["read_when_unread"] == ok["edit_when_read"] == 1.0
    assert all(v["hit"] == 1.0 for v in ok["kinds"].values())
    bad = _run(tok, cases, wrong_path)
    assert bad["combined"] == 0.0 and bad["read_tool_when_unread"] == bad["edit_tool_when_read"] == 1.0
    assert set(DECISIVE_READ) | set(DECISIVE_EDIT) <= set(ok["kinds"])


def test_probe_restores_training_mode(heldout):
    tok, cases = heldout
    lm = ScriptedLM(tok, always_read)
    probe(lm, tok, cases[:3])
    assert lm.training is True


def test_the_nll_all_store_holds_the_consensus_at_every_state_that_has_one(tmp_path):
    """``nll_all``'s data: every pair and every positive (the agent agreed) as a row whose chosen side is the
    teachers' consensus; the positives' rejected side is a stand-in its β-0 preference term never reads."""
    from composer_pipeline.experiments.read_before_edit.arms import ARMS, consensus_store
    from composer_pipeline.store import Store
    from composer_pipeline.train.config import HintTemplates
    from composer_pipeline.train.data import load_train_data
    from tests.support.synthetic_train import write_store

    src = Store(write_store(tmp_path / "train", 12, both_directions=True))
    pairs, positives = src.read_table("pairs").to_pylist(), src.read_table("positives").to_pylist()
    root = consensus_store(src.root, tmp_path / "everywhere", seed=0)
    data = load_train_data(root, heldout_fraction=0.0, hints=HintTemplates())
    assert len(data.pairs) == len(pairs) + len(positives) and positives
    want = {r["state_id"]: r["chosen_text"] for r in pairs + positives}
    assert {p.state_id: p.chosen_text for p in data.pairs} == want
    assert ARMS["nll_all"].dpo_beta == 0.0 and ARMS["nll_all"].data == "consensus_all"


def test_the_nll_all_arm_reaches_positives_within_fewer_steps_than_pairs(tmp_path):
    """The trainer takes DPO batches as consecutive blocks of the table: ``nll_all``'s rows come in a seeded
    random order, so an arm of fewer steps than there are pairs still reads positives (with the pairs first it
    trained on exactly the ``nll`` arm's rows, and the control measured nothing); each seed its own order."""
    from composer_pipeline.experiments.read_before_edit.arms import consensus_store
    from composer_pipeline.store import Store
    from composer_pipeline.train.config import HintTemplates
    from composer_pipeline.train.data import load_train_data
    from tests.support.synthetic_train import write_store

    src = Store(write_store(tmp_path / "train", 12, both_directions=True))
    pair_states = {r["state_id"] for r in src.read_table("pairs").to_pylist()}
    orders = []
    for seed in (0, 1):
        root = consensus_store(src.root, tmp_path / f"s{seed}", seed)
        data = load_train_data(root, heldout_fraction=0.0, hints=HintTemplates())
        first = [p.state_id for p in data.pairs[: len(pair_states) // 2]]
        assert any(s not in pair_states for s in first), (seed, first)
        orders.append([p.state_id for p in data.pairs])
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])


def test_the_preference_tokens_setting_reaches_every_dpo_arm_but_the_candidates(tmp_path):
    from pathlib import Path

    from composer_pipeline.experiments.read_before_edit.arms import arm_recipe
    from composer_pipeline.experiments.read_before_edit.config import load_config
    from composer_pipeline.train.config import TrainRecipe

    base = TrainRecipe.load(Path(__file__).resolve().parents[2] / "recipes" / "train.yaml")
    cfg = load_config("smollm2", tmp_path, preference_tokens="first_differing")
    assert cfg.arms == ("start", "nll", "dpo", "nll_all", "dpo_shuffled")  # the pre-registered table
    tokens = {
        a: arm_recipe(base, a, cfg, tmp_path, 0).dpo.preference_tokens for a in ("dpo", "dpo_shuffled", "dpo_differing")
    }
    assert tokens == {"dpo": "first_differing", "dpo_shuffled": "first_differing", "dpo_differing": "differing"}
    assert arm_recipe(base, "dpo", load_config("smollm2", tmp_path), tmp_path, 0).dpo.preference_tokens == "all"
    assert cfg.fingerprint()["preference_tokens"] == "first_differing"  # cells of other settings never mix


def test_the_dpop_arm_is_the_dpo_arm_with_the_dpop_variant(tmp_path):
    """``dpop``: the ``dpo`` arm's recipe (weights, NLL weight, tokens) with ``dpo.variant: dpop`` and the
    recipe's λ; every other DPO arm keeps the recipe's variant."""
    from dataclasses import replace
    from pathlib import Path

    from composer_pipeline.experiments.read_before_edit.arms import arm_recipe
    from composer_pipeline.experiments.read_before_edit.config import load_config
    from composer_pipeline.train.config import TrainRecipe

    base = TrainRecipe.load(Path(__file__).resolve().parents[2] / "recipes" / "train.yaml")
    cfg = load_config("fmt", tmp_path)
    dpop, dpo = arm_recipe(base, "dpop", cfg, tmp_path, 0), arm_recipe(base, "dpo", cfg, tmp_path, 0)
    assert dpop.dpo.variant == "dpop" and dpop.dpo.dpop_lambda == base.dpo.dpop_lambda == 50.0
    assert dpo.dpo.variant == "dpo"
    assert replace(dpop, dpo=replace(dpop.dpo, variant="dpo")) == dpo
    assert dpop.dpo.sft_weight == cfg.dpo_sft_weight > 0
    first = arm_recipe(base, "dpop_first", cfg, tmp_path, 0).dpo
    assert (first.variant, first.preference_tokens) == ("dpop", "first_differing")


def test_the_plans_variant_reaches_the_live_preference_arms_only(tmp_path):
    """smollm2_plan's ``dpo_variant: dpop``: its ``dpo`` arm is run 7's ``dpop_first`` (and its control
    ``dpo_shuffled`` the same loss on swapped sides); the NLL-only arms (β 0) keep the experiment's own
    plain ``dpo``, whatever the shipped recipe's default (its defaults changed on these results)."""
    from pathlib import Path

    from composer_pipeline.experiments.read_before_edit.arms import arm_recipe
    from composer_pipeline.experiments.read_before_edit.config import load_config
    from composer_pipeline.train.config import TrainRecipe

    base = TrainRecipe.load(Path(__file__).resolve().parents[2] / "recipes" / "train.yaml")
    plan = load_config("smollm2_plan", tmp_path)
    got = {a: arm_recipe(base, a, plan, tmp_path, 0).dpo for a in ("dpo", "dpo_shuffled", "nll", "nll_all")}
    assert {a: d.variant for a, d in got.items()} == {
        "dpo": "dpop",
        "dpo_shuffled": "dpop",
        "nll": "dpo",
        "nll_all": "dpo",
    }
    assert got["dpo"] == arm_recipe(base, "dpop_first", plan, tmp_path, 0).dpo
    assert all(d.data_order == "table" for d in got.values())  # as every committed cell ran
    plain = arm_recipe(base, "dpo", load_config("smollm2", tmp_path), tmp_path, 0).dpo
    assert (plain.variant, plain.preference_tokens) == ("dpo", "all") != (base.dpo.variant, base.dpo.preference_tokens)
    assert plan.fingerprint()["dpo_variant"] == "dpop"
    # a config without the setting keeps the fingerprint it had (run dirs made before it resume)
    assert "dpo_variant" not in load_config("smollm2", tmp_path).fingerprint()
