from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.pairs.config import SignatureRules
from composer_pipeline.pairs.signature import (
    action_signature,
    group_actions,
    markup_tags,
    same_decision,
    same_text,
    specifics,
    strip_markup,
    text_similarity,
)

R = SignatureRules()


def call(name, **args):
    return Action(tool_calls=(ToolCall(name, args),))


def test_file_tools_compare_normalised_path_only():
    a = call("Read", file_path="/repo/src/./app.py", offset=10)
    b = call("Read", file_path="/repo/src/app.py")
    assert action_signature(a, R) == action_signature(b, R) == "tool:Read(file_path=/repo/src/app.py)"
    assert action_signature(call("Read", file_path="/repo/src/other.py"), R) != action_signature(b, R)


def test_shell_commands_compare_with_whitespace_collapsed():
    assert same_decision(call("Bash", command="pytest   -q\n", description="x"), call("Bash", command="pytest -q"), R)
    assert not same_decision(call("Bash", command="pytest -q"), call("Bash", command="pytest -x"), R)


def test_unlisted_tool_uses_all_arguments_and_call_order_is_ignored():
    a = Action(tool_calls=(ToolCall("Foo", {"a": 1, "b": [1, 2]}), ToolCall("Read", {"file_path": "x"})))
    b = Action(tool_calls=(ToolCall("Read", {"file_path": "x"}), ToolCall("Foo", {"b": [1, 2], "a": 1})))
    assert action_signature(a, R) == action_signature(b, R)
    ordered = SignatureRules(ignore_call_order=False)
    assert action_signature(a, ordered) != action_signature(b, ordered)
    assert not same_decision(a, call("Foo", a=1, b=[2, 1]), R)


def test_configured_key_arguments_override_defaults():
    rules = SignatureRules.from_dict({"key_arguments": {"Edit": ["file_path", "new_string"]}})
    a = call("Edit", file_path="f", old_string="1", new_string="2")
    b = call("Edit", file_path="f", old_string="1", new_string="3")
    assert not same_decision(a, b, rules)
    assert same_decision(a, b, R)


def test_text_answers_use_similarity_threshold():
    assert text_similarity("All tests pass now.", "all tests pass now!") == 1.0
    assert same_decision(Action(text="All tests pass now."), Action(text="all tests pass now!"), R)
    assert not same_decision(Action(text="All tests pass now."), Action(text="The schema needs a migration."), R)
    # a text answer never agrees with a tool call
    assert not same_decision(Action(text="Read file"), call("Read", file_path="file"), R)
    strict = SignatureRules(text_similarity_threshold=1.0)
    assert not same_decision(Action(text="tests pass now"), Action(text="all tests pass now"), strict)


def test_group_actions_largest_first():
    groups = group_actions(
        [
            ("a", call("Read", file_path="x")),
            ("b", Action(text="done with it")),
            ("c", call("Read", file_path="./x")),
            ("d", Action(text="Done with it!")),
            ("e", call("Bash", command="ls")),
        ],
        R,
    )
    assert [len(g.members) for g in groups] == [2, 2, 1]  # largest first; ties by signature
    by_sig = {g.signature: sorted(g.members) for g in groups}
    assert by_sig["tool:Read(file_path=x)"] == ["a", "c"]
    assert by_sig["tool:Bash(command=ls)"] == ["e"]
    text = [g for g in groups if g.signature.startswith("text:")]
    assert len(text) == 1 and sorted(text[0].members) == ["b", "d"]


def test_bad_rules_are_refused():
    import pytest

    with pytest.raises(ValueError, match="unknown keys"):
        SignatureRules.from_dict({"key_args": {}})
    with pytest.raises(ValueError, match="text_similarity_threshold"):
        SignatureRules.from_dict({"text_similarity_threshold": 0})


# the demo's real failure (bench/RESULTS.md, issue 24): two samples echo the /init slash-command markup of
# the prompt and then say different things; word-bag similarity over the markup made them "agree"
INIT = "<command-message>init is analyzing your codebase</command-message>\n<command-name>/init</command-name>\n"
RUN, READ_FILE = (
    Action(text=INIT + "<command-args>/run</command-args>"),
    Action(text=INIT + "<command-args>/read-file</command-args>"),
)


def test_echoed_markup_is_no_agreement():
    assert text_similarity(RUN.text, READ_FILE.text) >= R.text_similarity_threshold  # the old criterion: "agree"
    assert not same_decision(RUN, READ_FILE, R)
    assert [len(g.members) for g in group_actions([("s1", RUN), ("s2", READ_FILE)], R)] == [1, 1]
    assert same_decision(RUN, Action(text=RUN.text), R)  # the same text still agrees with itself
    assert markup_tags(RUN.text, R.echo_markup_tags) == ["command-args", "command-message", "command-name"]
    assert strip_markup("<command-name>/init</command-name> ok <b>x</b>", R.echo_markup_tags).split() == [
        "/init",
        "ok",
        "<b>x</b>",
    ]


def test_text_answers_agree_only_when_they_name_the_same_things():
    assert specifics("Set PORT to 8080 in src/app.py, then run `make_all`.") == {"8080", "src/app.py", "make_all"}
    assert not same_text("Set PORT to 8080 in the config.", "Set PORT to 9090 in the config.", R)
    assert same_text("All tests pass now.", "all tests pass now!", R)  # wording and case do not matter
    assert same_text("Done: PORT is 9 in /a/b.py.", "Done: PORT is 9 in /a/b.py", R)
    assert not same_text("Done: PORT is 9 in /a/b.py.", "Done: PORT is 9 in /a/c.py.", R)
    loose = SignatureRules(text_specifics_must_match=False)
    assert same_text("Set PORT to 8080 in the config.", "Set PORT to 9090 in the config.", loose)
    assert SignatureRules.from_dict({"echo_markup_tags": ["x-tag"]}).echo_markup_tags == ("x-tag",)
