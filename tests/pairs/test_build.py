import orjson
import pyarrow as pa
import pytest

from composer_pipeline import tables
from composer_pipeline.actions import Action
from composer_pipeline.pairs.build import build_pairs, pair_id_for
from composer_pipeline.pairs.config import PairRecipe
from composer_pipeline.render import Conversation, RenderOptions, render_state

from .conftest import BASH, DONE, EDIT, READ


def _build(t, recipe=None):
    return build_pairs(
        t["trace_states"], t["trace_messages"], t["teacher_replays"], recipe or PairRecipe.load(None), RenderOptions()
    )


def test_pair_when_teachers_agree_against_the_agent(session_tables):
    res = _build(session_tables)
    assert res.pairs.schema == tables.DPO_PAIRS and res.positives.schema == tables.DPO_PAIRS
    assert res.pairs.num_rows == 1
    p = res.pairs.to_pylist()[0]
    assert p["state_id"] == "s_bash_000000000002" and p["kind"] == "pair"
    assert Action.from_json(p["chosen"]).tool_calls[0].name == "Edit"
    assert Action.from_json(p["rejected"]) == BASH
    assert p["chosen_text"] == Action.from_json(p["chosen"]).to_text() and p["rejected_text"] == BASH.to_text()
    # alpha's latest answer (EDIT) superseded its older BASH one; gamma (with the agent) and delta (failed) are out
    assert (p["n_teachers"], p["n_agreeing"], p["agreeing_teachers"]) == (3, 2, ["alpha", "beta"])
    assert p["agreement_score"] == pytest.approx(2 / 3)
    assert p["consensus_signature"] == "tool:Edit(file_path=/repo/src/app.py)"
    assert p["agent_signature"] == "tool:Bash(command=pytest -q)"
    # cost: every call made for the state (0.001 + 0.001 + 0.002 + 0.001 + 0.0)
    assert p["cost_usd"] == pytest.approx(0.005)
    assert len(p["replay_call_ids"]) == 5 and "s_bash_000000000002-delta-0" in p["replay_call_ids"]
    assert p["pair_id"] == pair_id_for(p["state_id"], p["consensus_signature"]) and len(p["pair_id"]) == 20
    # lineage ids and error flag carried from the state
    assert (p["session_key"], p["session_id"], p["source_file"]) == ("proj__s1", "sess-1", "proj/s1.jsonl")
    assert p["source_lines"] == [4] and p["record_uuids"] == ["a2"] and p["has_error"] is True


def test_prompt_is_the_rendered_prefix(session_tables):
    res = _build(session_tables)
    p = res.pairs.to_pylist()[0]
    state = [s for s in session_tables["trace_states"].to_pylist() if s["state_id"] == p["state_id"]][0]
    rs = render_state(Conversation.from_table(session_tables["trace_messages"]), state, RenderOptions())
    assert orjson.loads(p["prompt"]) == rs.messages and orjson.loads(p["tools"]) == rs.tools
    msgs = orjson.loads(p["prompt"])
    assert msgs[0]["role"] == "system" and msgs[1]["content"].startswith("Please fix")
    assert msgs[2]["tool_calls"][0]["function"]["name"] == "Read" and msgs[-1]["role"] == "tool"


def test_positive_when_teachers_agree_with_agent(session_tables):
    res = _build(session_tables)
    assert res.positives.num_rows == 1
    q = res.positives.to_pylist()[0]
    assert q["kind"] == "positive" and q["state_id"] == "s_read_000000000001"
    assert Action.from_json(q["rejected"]) == READ
    assert q["agreeing_teachers"] == ["alpha", "beta"] and q["n_teachers"] == 3


def test_stats_account_for_every_state_and_replay(session_tables):
    res = _build(session_tables)
    s = res.stats
    assert s["states"] == 3 and s["pairs"] == 1 and s["positives"] == 1
    assert s["states_no_consensus"] == 1  # the text state: 1 vs 1 after a failure
    assert s["replays_not_answered"] == 2


def test_thresholds_come_from_the_recipe(session_tables):
    strict = PairRecipe.from_dict({"agreement_threshold": 3, "allow_self_consistency": False})
    res = _build(session_tables, strict)
    assert res.pairs.num_rows == 0 and res.positives.num_rows == 0
    assert res.stats["states_no_consensus"] == 2 and res.stats["states_too_few_teachers"] == 1
    # with self-consistency allowed (2 samples suffice) the 2-teacher text state is looked at too
    res = _build(session_tables, PairRecipe.from_dict({"agreement_threshold": 3}))
    assert res.stats["states_no_consensus"] == 3 and res.stats["states_too_few_teachers"] == 0
    loose_text = PairRecipe.from_dict(
        {
            "agreement_threshold": 1,
            "min_agreement_score": 0.0,
            "allow_ties": True,
            "min_teachers": 1,
            "teacher_preference": ["beta"],
        }
    )
    res = _build(session_tables, loose_text)
    # the text state now has a (tied) consensus; the agent said almost the same as alpha -> positive
    from composer_pipeline.pairs.signature import text_signature

    kinds = {r["state_id"]: r["kind"] for r in res.pairs.to_pylist() + res.positives.to_pylist()}
    alpha_first = text_signature("All tests pass now!") < text_signature("Let me look at the database schema first.")
    assert kinds["s_done_000000000003"] == ("positive" if alpha_first else "pair")
    pair = [r for r in res.pairs.to_pylist() if r["state_id"] == "s_bash_000000000002"][0]
    assert Action.from_json(pair["chosen"]) == Action.from_json(EDIT.to_json())  # beta preferred, same call
    no_err = PairRecipe.from_dict({"keep_error_states": False})
    assert _build(session_tables, no_err).stats["states_error_skipped"] == 1


def test_bad_replay_rows_are_counted_not_fatal(session_tables):
    import pyarrow as pa

    from .conftest import replay

    rows = session_tables["teacher_replays"].to_pylist()
    bad = replay("s_bash_000000000002", "epsilon", EDIT)
    bad["action"] = "{not json"
    rows.append(bad)
    rows.append(replay("unknown_state_xxxxxxx", "alpha", EDIT))
    t = dict(session_tables, teacher_replays=pa.Table.from_pylist(rows, schema=tables.TEACHER_REPLAYS))
    res = _build(t)
    assert res.stats["replays_bad_action_json"] == 1 and res.stats["replays_unknown_state"] == 1
    assert res.pairs.num_rows == 1


def test_recipe_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        PairRecipe.from_dict({"agreement_treshold": 2})
    with pytest.raises(FileNotFoundError):
        PairRecipe.load(tmp_path / "nope.yaml")
    r = PairRecipe.load(None)
    assert r.agreement_threshold == 2 and r.signature.key_arguments["Bash"] == ["command"]


def test_state_without_messages_is_counted_not_paired(session_tables):
    import pyarrow.compute as pc

    msgs = session_tables["trace_messages"]
    t = dict(session_tables, trace_messages=msgs.filter(pc.equal(msgs["stream_id"], "other:main")))
    res = _build(t)
    assert (
        res.pairs.num_rows == 0 and res.positives.num_rows == 0 and res.stats["states_no_messages"] == 3
    )  # rendered before votes are counted


def test_empty_inputs_give_empty_tables(session_tables):
    e = {k: v.slice(0, 0) for k, v in session_tables.items()}
    res = _build(e)
    assert res.pairs.num_rows == 0 and res.pairs.schema == tables.DPO_PAIRS and res.stats["states"] == 0


# --- votes are models, not teacher names -------------------------------------------------------------
from composer_pipeline.actions import ToolCall  # noqa: E402
from composer_pipeline.teachers.config import parse_teachers  # noqa: E402

from .conftest import replay  # noqa: E402

GREP = Action(tool_calls=(ToolCall("Grep", {"pattern": "x = 1", "path": "/repo"}),))


def _teachers(*entries):
    """(name, base_url, model, temperature) -> TeachersConfig."""
    return parse_teachers(
        {
            "ceiling_usd": 1.0,
            "teachers": [
                {
                    "name": n,
                    "base_url": u,
                    "model": m,
                    "temperature": t,
                    "api_key_env": None,
                    "input_usd_per_mtok": 0.1,
                    "output_usd_per_mtok": 0.1,
                    "budget_usd": 1.0,
                    "max_concurrency": 1,
                }
                for n, u, m, t in entries
            ],
        }
    )


def _with_replays(session_tables, rows):
    import pyarrow as pa

    return {**session_tables, "teacher_replays": pa.Table.from_pylist(rows, schema=tables.TEACHER_REPLAYS)}


def _bash_state(*answers):
    """Replay rows for the state where the agent ran `pytest -q` (BASH): (teacher, action) each."""
    return [replay("s_bash_000000000002", t, a) for t, a in answers]


def test_one_model_under_two_greedy_names_is_one_vote(session_tables):
    # the old demo: the same weights behind one server under two names, both greedy, "agree" by construction
    cfg = _teachers(
        ("smol-a", "http://127.0.0.1:8765/v1", "smollm2", 0.0),
        ("smol-b", "http://127.0.0.1:8765/v1/", "smollm2", 0.0),
        ("other", "http://127.0.0.1:9000/v1", "qwen", 0.0),
    )
    t = _with_replays(session_tables, _bash_state(("smol-a", EDIT), ("smol-b", EDIT), ("other", GREP)))
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and res.positives.num_rows == 0
    assert res.stats["answers_greedy_duplicates"] == 1 and res.stats["states_no_consensus"] == 1
    # ... while two distinct models that agree make a cross-model pair (n_agreeing counts models)
    t = _with_replays(session_tables, _bash_state(("smol-a", EDIT), ("smol-b", EDIT), ("other", EDIT)))
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    p = res.pairs.to_pylist()[0]
    assert p["agreement_kind"] == "cross_model"
    assert (p["n_teachers"], p["n_models"], p["n_models_agreeing"], p["n_agreeing"]) == (3, 2, 2, 2)
    assert p["agreeing_teachers"] == ["other", "smol-a", "smol-b"] and p["agreement_score"] == 1.0
    assert res.stats["states_cross_model"] == 1


def test_same_model_field_without_a_config_is_one_vote(session_tables):
    rows = _bash_state(("a", EDIT), ("b", EDIT), ("c", GREP))
    for r in rows:
        # what the replay table says each entry sent
        r["model"] = "smollm2"
    t = _with_replays(session_tables, rows)
    res = build_pairs(
        t["trace_states"], t["trace_messages"], t["teacher_replays"], PairRecipe.load(None), RenderOptions()
    )
    assert res.pairs.num_rows == 0 and res.stats["states_no_consensus"] == 1


def test_samples_of_one_model_are_self_consistency(session_tables):
    url = "http://127.0.0.1:8765/v1"
    cfg = _teachers(
        ("s1", url, "smollm2", 0.7),
        ("s2", url, "smollm2", 0.7),
        ("s3", url, "smollm2", 0.7),
        ("tiny", url, "tiny", 1.0),
    )
    t = _with_replays(session_tables, _bash_state(("s1", EDIT), ("s2", GREP), ("s3", EDIT), ("tiny", GREP)))
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    p = res.pairs.to_pylist()[0]
    assert p["agreement_kind"] == "self_consistency" and p["consensus_signature"].startswith("tool:Edit")
    # 2 of smollm2's 3 samples; 2 models answered and only smollm2 holds this decision
    assert (p["n_agreeing"], p["n_models"], p["n_models_agreeing"]) == (2, 2, 1)
    assert p["agreeing_teachers"] == ["s1", "s3"] and p["agreement_score"] == pytest.approx(2 / 3)
    assert res.stats["states_self_consistency"] == 1
    # the recipe can refuse this weaker kind of agreement
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.from_dict({"allow_self_consistency": False}),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and res.stats["states_no_consensus"] == 1


def test_distinct_models_outrank_samples(session_tables):
    # smollm2's samples all say GREP, but two other models agree on EDIT: the cross-model consensus wins
    url = "http://127.0.0.1:8765/v1"
    cfg = _teachers(
        ("s1", url, "smollm2", 0.7),
        ("s2", url, "smollm2", 0.7),
        ("m1", url, "qwen", 0.0),
        ("m2", "https://api.example/v1", "gpt", 0.0),
    )
    t = _with_replays(session_tables, _bash_state(("s1", GREP), ("s2", GREP), ("m1", EDIT), ("m2", EDIT)))
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    p = res.pairs.to_pylist()[0]
    assert p["agreement_kind"] == "cross_model" and p["agreeing_teachers"] == ["m1", "m2"]
    assert (p["n_models"], p["n_agreeing"]) == (3, 2) and p["agreement_score"] == pytest.approx(2 / 3)


def test_answers_that_decide_nothing_are_not_votes(session_tables):
    # a hallucinated tool, a Bash call without its command, texts that parrot the user's message / a tool result
    url = "http://127.0.0.1:8765/v1"
    cfg = _teachers(
        ("m1", url, "a", 0.0),
        ("m2", url, "b", 0.0),
        ("m3", url, "c", 0.0),
        ("m4", url, "d", 0.0),
        ("m5", url, "e", 0.0),
        ("m6", url, "f", 0.0),
    )
    mean = Action(tool_calls=(ToolCall("Mean", {"file_path": "/repo/src/app.py"}),))
    bare_bash = Action(tool_calls=(ToolCall("Bash", {}),))
    echo = Action(text="Please fix the failing test in src/app.py")
    # the tool result the BASH state's prefix ends with
    echo_tool = Action(text="1 failed")
    rows = [
        replay("s_read_000000000001", t, a)
        for t, a in (("m1", mean), ("m2", mean), ("m3", bare_bash), ("m4", bare_bash), ("m5", echo), ("m6", echo))
    ]
    rows += [replay("s_done_000000000003", t, echo_tool) for t in ("m1", "m2")]
    t = _with_replays(session_tables, rows)
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and res.positives.num_rows == 0
    s = res.stats
    assert (s["answers_unknown_tool"], s["answers_missing_key_arguments"], s["answers_echo_prompt"]) == (2, 2, 4)
    loose = PairRecipe.from_dict(
        {
            "require_offered_tools": False,
            "require_key_arguments": False,
            "reject_prompt_echo": False,
            "allow_ties": True,
            "min_agreement_score": 0.0,
            "drop_parroting_chosen": False,
        }
    )
    res = build_pairs(
        t["trace_states"], t["trace_messages"], t["teacher_replays"], loose, RenderOptions(), teachers=cfg
    )
    # the same answers count when the recipe says so
    assert res.pairs.num_rows + res.positives.num_rows == 2
    # ... but a pair whose chosen side parrots its prompt is still no pair unless that is switched off too
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.from_dict(
            {
                "require_offered_tools": False,
                "require_key_arguments": False,
                "reject_prompt_echo": False,
                "allow_ties": True,
                "min_agreement_score": 0.0,
            }
        ),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and res.dropped.num_rows == 2 - res.positives.num_rows
    assert set(res.dropped.column("drop_reason").to_pylist()) == {"chosen_parrots_prompt"}


def _slash_command_session(answers):
    """The demo's real shape: the user ran /init (Claude Code's markup plus the command's prompt), the agent
    answered with its plan; ``answers`` = (teacher, action) replay rows for that state."""
    import pyarrow as pa

    from .conftest import _msg, _state, replay

    plan = Action(text="I'll start by exploring the repository layout, then write CLAUDE.md.")
    messages = [
        _msg(1, "u1", None, "user", "Earlier: please keep the README short."),
        _msg(2, "a1", "u1", "assistant", [{"type": "text", "text": "Noted."}], "m1"),
        _msg(3, "u2", "a1", "user", INIT_PROMPT),
        _msg(4, "a2", "u2", "assistant", [{"type": "text", "text": plan.text}], "m2"),
    ]
    states = [_state("s_init_000000000001", plan, "u2", 4, "a2", "m2")]
    return {
        "trace_states": pa.Table.from_pylist(states, schema=tables.TRACE_STATES),
        "trace_messages": pa.Table.from_pylist(messages, schema=tables.TRACE_MESSAGES),
        "teacher_replays": pa.Table.from_pylist(
            [replay("s_init_000000000001", t, a) for t, a in answers], schema=tables.TEACHER_REPLAYS
        ),
    }


INIT_PROMPT = (
    "<command-message>init is analyzing your codebase…</command-message>\n<command-name>/init</command-name>\n"
    "Please analyze this codebase and create a CLAUDE.md file, which will be given to future instances of "
    "Claude Code to operate in this repository. Include the commands used to build, lint and test."
)
ECHO = "<command-name>/init</command-name>\n<command-message>init</command-message>\n<command-args>{}</command-args>"


def test_teachers_echoing_slash_command_markup_do_not_agree_and_never_become_chosen():
    url = "http://127.0.0.1:8765/v1"
    cfg = _teachers(("s1", url, "smollm2", 0.7), ("s2", url, "smollm2", 0.7), ("tiny", url, "tiny", 0.7))
    # the demo: two samples echo the markup and then say different things (/run vs /read-file)
    t = _slash_command_session(
        [
            ("s1", Action(text=ECHO.format("/run"))),
            ("s2", Action(text=ECHO.format("/read-file"))),
            ("tiny", Action(text="zq zq zq")),
        ]
    )
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and res.dropped.num_rows == 0 and res.stats["states_no_consensus"] == 1
    # two samples that echo the same markup do agree (same content): the pair is dropped, with the reason
    t = _slash_command_session([("s1", Action(text=ECHO.format("/run"))), ("s2", Action(text=ECHO.format("/run")))])
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and res.stats["pairs_dropped_parrot"] == 1
    (d,) = res.dropped.to_pylist()
    assert res.dropped.schema == tables.DROPPED_PAIRS and d["drop_op"] == "pairs.build"
    assert d["drop_reason"] == "chosen_echoes_markup: <command-args>, <command-message>, <command-name>"
    assert d["chosen_text"] == ECHO.format("/run") and "exploring the repository" in d["rejected_text"]


def test_a_chosen_side_that_parrots_an_earlier_prompt_message_is_dropped_with_the_reason():
    url = "http://127.0.0.1:8765/v1"
    cfg = _teachers(("a", url, "m-a", 0.0), ("b", url, "m-b", 0.0))
    # the first user message, not the last one
    parrot = Action(text="Earlier: please keep the README short!")
    t = _slash_command_session([("a", parrot), ("b", parrot)])
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 0 and [d["drop_reason"] for d in res.dropped.to_pylist()] == ["chosen_parrots_prompt"]
    # a real answer of its own is a pair; the recipe can switch the drop off
    own = Action(text="I will list the build, lint and test commands in CLAUDE.md after reading pyproject.toml.")
    t = _slash_command_session([("a", own), ("b", own)])
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.load(None),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 1 and res.dropped.num_rows == 0
    t = _slash_command_session([("a", parrot), ("b", parrot)])
    res = build_pairs(
        t["trace_states"],
        t["trace_messages"],
        t["teacher_replays"],
        PairRecipe.from_dict({"drop_parroting_chosen": False}),
        RenderOptions(),
        teachers=cfg,
    )
    assert res.pairs.num_rows == 1


def test_an_answer_cut_at_its_token_limit_never_votes_nor_becomes_the_chosen_side(session_tables):
    """Issue 34: an answer whose ``finish_reason`` says it hit ``max_tokens`` (OpenAI ``length``, Anthropic
    ``max_tokens``) is half an action (a tool call with ``{}`` arguments): it is dropped before the vote."""
    cfg = _teachers(
        ("a", "http://127.0.0.1:9001/v1", "model-a", 0.0),
        ("b", "http://127.0.0.1:9002/v1", "model-b", 0.0),
        ("c", "http://127.0.0.1:9003/v1", "model-c", 0.0),
    )

    def build(finish_a, finish_b):
        rows = _bash_state(("a", EDIT), ("b", EDIT), ("c", GREP))
        rows[0]["finish_reason"], rows[1]["finish_reason"], rows[2]["finish_reason"] = finish_a, finish_b, "stop"
        t = _with_replays(session_tables, rows)
        return build_pairs(
            t["trace_states"],
            t["trace_messages"],
            t["teacher_replays"],
            PairRecipe.load(None),
            RenderOptions(),
            teachers=cfg,
        )

    whole = build("tool_calls", "tool_use")
    assert whole.pairs.num_rows == 1 and whole.stats["answers_cut_dropped"] == 0
    assert Action.from_json(whole.pairs.to_pylist()[0]["chosen"]) == EDIT
    cut = build("length", "max_tokens")
    assert cut.stats["answers_cut_dropped"] == 2
    assert cut.pairs.num_rows == 0 and cut.positives.num_rows == 0


def _prompt(*turns) -> str:
    msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Fix src/app.py"}]
    for t in turns:
        if isinstance(t, Action):
            msgs.append(t.to_chat_message())
            msgs += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in t.tool_calls]
        else:
            msgs.append({"role": "user", "content": t})
    return orjson.dumps(msgs).decode()


def test_repeat_of_the_last_call_is_told_apart_from_a_next_step():
    from composer_pipeline.actions import ToolCall
    from composer_pipeline.pairs.build import repeat_reason

    pytest_again = Action(tool_calls=(ToolCall("Bash", {"command": "pytest -q"}),))
    empty_edit = Action(tool_calls=(ToolCall("Edit", {"new_string": "", "old_string": "", "file_path": "/a.py"}),))
    assert repeat_reason(pytest_again, _prompt(EDIT, BASH)) == "chosen_repeats_last_call: Bash"
    # same arguments in another key order / another call id: still the same call
    assert (
        repeat_reason(
            empty_edit,
            _prompt(
                Action(tool_calls=(ToolCall("Edit", {"file_path": "/a.py", "old_string": "", "new_string": ""}, "x"),))
            ),
        )
        == "chosen_repeats_last_call: Edit"
    )
    # another hunk of the same file: not the same call
    other_hunk = Action(tool_calls=(ToolCall("Edit", {**EDIT.tool_calls[0].arguments, "new_string": "x = 3"}),))
    assert repeat_reason(other_hunk, _prompt(EDIT)) is None
    # running the tests again after an edit is the next step, not a repeat
    assert repeat_reason(pytest_again, _prompt(BASH, EDIT)) is None
    # other arguments, a user turn since, a text answer: no repeat
    assert repeat_reason(Action(tool_calls=(ToolCall("Bash", {"command": "pytest -x"}),)), _prompt(BASH)) is None
    assert repeat_reason(pytest_again, _prompt(BASH, "run them again please")) is None
    assert repeat_reason(DONE, _prompt(BASH)) is None


def test_a_pair_whose_chosen_side_repeats_the_last_call_is_dropped_with_its_reason(session_tables):
    """The demo's pairs: the consensus ran `pytest -q` again right after it ran (nothing done in between);
    the agent's next step was the rejected side. Such a pair teaches repetition: dropped, with the reason."""
    from .conftest import replay

    t = dict(session_tables)
    rows = [r for r in t["teacher_replays"].to_pylist() if r["state_id"] != "s_done_000000000003"]
    rows += [replay("s_done_000000000003", name, BASH) for name in ("alpha", "beta")]
    t["teacher_replays"] = pa.Table.from_pylist(rows, schema=t["teacher_replays"].schema)
    res = _build(t)
    assert "s_done_000000000003" not in res.pairs.column("state_id").to_pylist()
    (d,) = [d for d in res.dropped.to_pylist() if d["state_id"] == "s_done_000000000003"]
    assert d["drop_op"] == "pairs.build" and d["drop_reason"] == "chosen_repeats_last_call: Bash"
    assert res.stats["pairs_dropped_repeat"] == 1 and res.stats["answers_repeat_last_call"] == 2
    # the state-2 pair (Edit after `pytest -q` failed) stays: a next step, not a repeat
    assert "s_bash_000000000002" in res.pairs.column("state_id").to_pylist()
    # a switch, like the parrot rule: off, the pair is built
    off = _build(t, PairRecipe.from_dict({"drop_repeating_chosen": False}))
    assert "s_done_000000000003" in off.pairs.column("state_id").to_pylist()
    assert off.stats["answers_repeat_last_call"] == 2  # still counted
