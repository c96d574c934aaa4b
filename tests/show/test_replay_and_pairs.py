"""What `show` prints is what was paid for: states replayed over real HTTP by two teachers (request bodies
recorded by the server), then paired; `show --json` prefixes are compared with the bodies received."""

from __future__ import annotations

from collections import Counter

import orjson

from composer_pipeline.show import PairView, gather, render_markdown, view_from_dict
from composer_pipeline.store import Store
from composer_pipeline.teachers.cache import without_error_marks

from .conftest import cli


def _show_json(*argv) -> list[dict]:
    rc, out, err = cli("show", *argv, "--json")
    assert rc == 0, err
    return [orjson.loads(line) for line in out.splitlines()]


def test_prefix_equals_the_messages_the_teachers_received(replayed):
    views = _show_json(*replayed["state_ids"], "--store", replayed["root"], "--teachers", replayed["teachers"])
    assert [v["state_id"] for v in views] == replayed["state_ids"]
    received = [orjson.loads(b) for b in replayed["bodies"]]
    # two teachers, one request each, nothing retried
    assert len(received) == 2 * len(views)
    # the multiset of received (messages, tools) is exactly each shown (prefix, tools) once per teacher
    got = Counter(orjson.dumps([b["messages"], b.get("tools")], option=orjson.OPT_SORT_KEYS) for b in received)
    # (an OpenAI-style teacher gets a failed tool result without the is_error mark Claude gets: cache.without_error_marks)
    prefixes = [without_error_marks({"messages": v["prefix"]})["messages"] for v in views]
    want = Counter(
        orjson.dumps([p, v["tools"] or None], option=orjson.OPT_SORT_KEYS)
        for p, v in zip(prefixes, views)
        for _ in range(2)
    )
    assert got == want
    for v, prefix in zip(views, prefixes):
        bodies = [b for b in received if b["messages"] == prefix]
        assert sorted(b["model"] for b in bodies) == ["scripted-a", "scripted-b"]
        assert v["replayed"] is True and [t["teacher"] for t in v["teachers"]] == ["alpha", "beta"]
        for t in v["teachers"]:
            assert t["status"] == "answered" and t["action"]["tool_calls"][0]["name"] == "Read"
            assert t["cost_usd"] > 0 and t["latency_s"] > 0 and t["prompt_tokens"] > 0
            # call_id == hash of the body rebuilt from this prefix
            assert t["sent_as_shown"] is True


def test_other_render_options_are_flagged_as_not_sent(replayed, tmp_path):
    recipe = tmp_path / "ingest.yaml"
    recipe.write_text("render:\n  system_prompt: A different system prompt.\n")
    (v,) = _show_json(
        replayed["state_ids"][0], "--store", replayed["root"], "--teachers", replayed["teachers"], "--recipe", recipe
    )
    assert v["prefix"][0]["content"] == "A different system prompt."
    assert [t["sent_as_shown"] for t in v["teachers"]] == [False, False]
    rc, out, _ = cli(
        "show",
        replayed["state_ids"][0],
        "--store",
        replayed["root"],
        "--teachers",
        replayed["teachers"],
        "--recipe",
        recipe,
    )
    assert rc == 0 and "SENT A DIFFERENT PREFIX" in out


def test_pair_view_shows_chosen_and_rejected(replayed):
    store = Store(replayed["root"])
    pairs = store.read_table("normalized_dpo_pairs").to_pylist()
    assert pairs, "both teachers answer Read(/repo/app.py): a consensus that differs from the agent"
    p = pairs[0]
    (d,) = _show_json(p["pair_id"][:7], "--store", replayed["root"])
    assert d["kind"] == "pair" and d["pair_id"] == p["pair_id"] and d["state_id"] == p["state_id"]
    assert d["chosen"] == orjson.loads(p["chosen"]) and d["rejected"] == orjson.loads(p["rejected"])
    assert d["n_agreeing"] == 2 and d["n_teachers"] == 2 and d["agreeing_teachers"] == ["alpha", "beta"]
    assert d["agreement_kind"] == "cross_model" and (d["n_models"], d["n_models_agreeing"]) == (2, 2)
    assert d["agreement_score"] == 1.0 and {"table": "normalized_dpo_pairs", "status": "kept"} in d["pair_tables"]
    assert d["prompt_matches_prefix"] is True and d["prefix"] == orjson.loads(p["prompt"])
    assert d["rejected"] == d["action"] and d["source_lines"] == p["source_lines"]
    view = view_from_dict(d)
    assert isinstance(view, PairView) and view.to_dict() == d

    rc, out, err = cli("show", p["pair_id"], "--store", replayed["root"], "--width", "140")
    assert rc == 0, err
    head = out.split("── what the agent saw")[0]
    assert f"pair {p['pair_id']}" in head and "agree    cross_model: 2 of 2 models (alpha, beta)" in head
    assert "── chosen (alpha, beta)" in head and "── rejected (the agent)" in head and " │ " in head
    side = [ln for ln in head.splitlines() if " │ " in ln]
    assert any('→ Read(file_path="/repo/app.py")' in ln.split(" │ ")[0] for ln in side)  # chosen on the left
    first_agent_call = (
        d["rejected"]["tool_calls"][0]["name"] if d["rejected"]["tool_calls"] else d["rejected"]["text"][:20]
    )
    assert any(first_agent_call in ln.split(" │ ")[1] for ln in side)  # the agent's action on the right
    assert "alpha (scripted-a)  answered" in out and "[agrees" in out and "$0.0" in out

    md = render_markdown(next(gather(replayed["root"], [p["pair_id"]])))
    assert "- **agreement: cross_model**, 2 of 2 models; teachers: alpha, beta" in md
    assert (
        md.startswith(f"## Pair `{p['pair_id']}`")
        and "| chosen (teacher consensus) | rejected (the agent's action) |" in md
    )
    assert "#### What the agent saw" in md and "#### Teachers" in md and md.count("```") % 2 == 0


def test_in_memory_pair_views_equal_the_stored_ones(replayed):
    """Dagster's asset metadata builds pair views from the tables in memory (show.pair_views): the same
    view `show` gathers from the store, so one Markdown renderer serves both."""
    from composer_pipeline.show import pair_views

    store = Store(replayed["root"])
    pairs = store.read_table("normalized_dpo_pairs")
    pid = pairs.column("pair_id")[0].as_py()
    (mem,) = pair_views(
        pairs,
        store.read_table("trace_states"),
        store.read_table("trace_messages"),
        store.read_table("teacher_replays"),
        table="normalized_dpo_pairs",
        pair_ids=[pid],
    )
    (stored,) = gather(replayed["root"], [pid])
    assert mem.state.to_dict() == stored.state.to_dict() and mem.chosen == stored.chosen
    assert mem.prompt_matches_prefix is True and mem.agreement == stored.agreement
    assert mem.tables == [{"table": "normalized_dpo_pairs", "status": "kept"}]
    assert render_markdown(mem).startswith(f"## Pair `{pid}`")
    # no states at hand: the pair's stored prompt
    (bare,) = pair_views(pairs, None, None, pair_ids=[pid])
    assert bare.state.prefix == orjson.loads(pairs.column("prompt")[0].as_py())
