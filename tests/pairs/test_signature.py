from composer_pipeline.actions import Action, ToolCall
from composer_pipeline.pairs.signature import (
    SignatureRules,
    action_signature,
    group_actions,
    same_decision,
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
