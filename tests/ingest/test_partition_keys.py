"""Short partition keys (<project>/<id>): readable, valid Dagster keys, unique, stable; a newcomer
sharing an older key's id prefix gets a longer key and the older key keeps naming its session;
long keys of older instances keep working."""

import dagster as dg
import pytest

from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.ingest.partition_keys import KeyMap, PartitionKeyError, candidates, project_name

A = "-home-dev-calc__abcdef12-1111-4a4a-8a8a-000000000001"
B = "-home-dev-calc__abcdef12-9999-4b4b-8b8b-000000000002"  # same first 8 characters as A
C = "-home-dev-calc__c3d2e1f0-3333-4c4c-8c8c-000000000003"


def test_keys_are_short_readable_and_valid(repo_root):
    sessions = [sf.key for sf in discover_sessions(repo_root / "composer_pipeline/samples/projects")]
    keys = KeyMap(sessions).assign()
    assert keys == {
        "-home-demo-calc__a1f0c3d2-1111-4a4a-8a8a-000000000001": "calc/a1f0c3d2",
        "-home-demo-calc__b2e1d4c3-2222-4b4b-8b8b-000000000002": "calc/b2e1d4c3",
        "-home-demo-calc__c3d2e1f0-3333-4c4c-8c8c-000000000003": "calc/c3d2e1f0",
    }
    pdef = dg.DynamicPartitionsDefinition(name="sessions")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("sessions", list(keys.values()))  # Dagster accepts them as keys
    assert sorted(pdef.get_partition_keys(dynamic_partitions_store=instance)) == sorted(keys.values())
    # the project without Claude Code's encoded home prefix; other file names whole; odd characters out
    assert project_name("-Users-alice-src-app__x") == "src-app"
    assert project_name("C--Users-bob-app__y") == "app"
    assert project_name("d-kimuson__claude-code-viewer__fe5e1c67-53e7-4862-81ae-d0e013e3270b") == "claude-code-viewer"
    assert candidates("marot__spotter__tool_heavy")[0] == "spotter/tool_heavy"
    assert candidates("short")[0] == "_/short"
    assert candidates("-home-dev-x__we...ird name")[0] == "x/we-ird-name"


def test_same_input_same_keys_whatever_the_order():
    one = KeyMap([A, B, C]).assign()
    two = KeyMap([C, B, A]).assign()
    assert one == two and len(set(one.values())) == 3
    assert one[C] == "calc/c3d2e1f0"
    # A and B arrived together: neither gets the shared 8 characters
    assert one[A] == "calc/abcdef12-1" and one[B] == "calc/abcdef12-9"


def test_a_newcomer_with_an_older_keys_prefix_gets_a_longer_key_and_the_older_key_stays():
    first = KeyMap([A, C]).assign()
    assert first[A] == "calc/abcdef12"
    keymap = KeyMap([A, B, C], first.values(), pins={"calc/abcdef12": A})  # A was materialized as that key
    added = keymap.assign()
    assert added == {B: "calc/abcdef12-9"}
    # read back with every key given: the newest resolves first, then the older one it lengthened past
    again = KeyMap([A, B, C], [*first.values(), *added.values()])
    assert again.session_key("calc/abcdef12") == A and again.session_key("calc/abcdef12-9") == B
    assert not again.tied and again.assign() == {}


def test_without_a_record_the_tie_is_decided_the_same_way_every_time_and_reported():
    keymap = KeyMap([B, A], ["calc/abcdef12"])
    assert keymap.session_key("calc/abcdef12") == A and keymap.tied == ["calc/abcdef12"]
    assert KeyMap([A, B], ["calc/abcdef12"], pins={"calc/abcdef12": B}).session_key("calc/abcdef12") == B


def test_long_keys_of_older_instances_keep_naming_their_sessions():
    # an instance from before short keys knows A by its session key
    keymap = KeyMap([A, C], [A])
    assert keymap.session_key(A) == A
    assert keymap.assign() == {C: "calc/c3d2e1f0"}  # only the new session gets a short key
    assert keymap.partition_of == {A: A, C: "calc/c3d2e1f0"}


def test_keys_naming_nothing_fail_with_the_reason():
    keymap = KeyMap([C], ["calc/abcdef12", A])
    with pytest.raises(PartitionKeyError, match="calc/abcdef12.*no session"):
        keymap.session_key("calc/abcdef12")
    with pytest.raises(PartitionKeyError, match="moved or deleted"):
        keymap.session_key(A)
