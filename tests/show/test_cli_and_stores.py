"""`show` options and failure modes: compaction after/full (flag and recipe), interrupted calls, clear
errors with exit code 2, S3 (moto on 127.0.0.1) in the Dagster partitioned layout, Markdown."""

from __future__ import annotations

import orjson
import pyarrow.compute as pc
import pytest

from composer_pipeline.render import INTERRUPTED, record_payload
from composer_pipeline.show import ShowError, format_view, gather, render_markdown, resolve_ids, state_views
from composer_pipeline.store import Store

from .conftest import cli
from .test_corpus import check_tool_answers

COMPACTED = "c3d2e1f0-3333-4c4c-8c8c-000000000003"


def _json(*argv) -> list[dict]:
    rc, out, err = cli("show", *argv, "--json")
    assert rc == 0, err
    return [orjson.loads(line) for line in out.splitlines()]


def _compacted_state(samples_store) -> dict:
    """The last state of the sample session that was /compact-ed (its chain crosses the boundary)."""
    states = Store(str(samples_store)).read_table("trace_states").to_pylist()
    return [s for s in states if s["session_id"] == COMPACTED][-1]


def test_compaction_after_by_default_full_on_request(samples_store, tmp_path):
    sid = _compacted_state(samples_store)["state_id"]
    (after,) = _json(sid, "--store", samples_store)
    (full,) = _json(sid, "--store", samples_store, "--compaction", "full")
    recipe = tmp_path / "ingest.yaml"
    recipe.write_text("render:\n  compaction: full\n  strip_thinking: true\n")
    (by_recipe,) = _json(sid, "--store", samples_store, "--recipe", recipe)
    assert after["render"]["compaction"] == "after" and full["render"]["compaction"] == "full"
    assert by_recipe["prefix"] == full["prefix"]
    messages = Store(str(samples_store)).read_table("trace_messages")
    summary = messages.filter(pc.equal(messages.column("is_compact_summary"), True)).to_pylist()
    (summary,) = [m for m in summary if m["session_key"] == after["session_key"]]
    summary_text = record_payload(summary["raw"], summary["record_type"])[0]
    summary_text = summary_text if isinstance(summary_text, str) else summary_text[0]["text"]
    # after: what the agent really had = the summary (first user message) and what follows
    assert after["prefix"][1] == {"role": "user", "content": summary_text}
    # full: the stitched pre-compaction history, without the now redundant summary
    assert len(full["prefix"]) > len(after["prefix"])
    assert all(m.get("content") != summary_text for m in full["prefix"])
    assert full["prefix"][-(len(after["prefix"]) - 2) :] == after["prefix"][2:]
    for v in (after, full):
        check_tool_answers(v["prefix"])


def test_interrupted_calls_are_marked(samples_store):
    views = _json("--all", "--store", samples_store)
    assert len(views) == 22
    interrupted = [v for v in views if check_tool_answers(v["prefix"])["interrupted"]]
    assert interrupted
    v = interrupted[0]
    rc, out, _ = cli("show", v["state_id"], "--store", samples_store)
    assert rc == 0 and "INTERRUPTED (no result before this step)" in out
    md = render_markdown(next(gather(str(samples_store), [v["state_id"]])))
    assert "*interrupted (no result before this step)*" in md
    # 2.1.x subagents dir: the prefix starts at the subagent's own prompt
    sub = [v for v in views if v["stream_kind"] == "subagents_dir"]
    assert sub and all(v["prefix"][1]["content"] != views[0]["prefix"][1]["content"] for v in sub)
    assert any(INTERRUPTED == m.get("content") for v in interrupted for m in v["prefix"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["zzzzzzzzzz"], "no state or pair with id 'zzzzzzzzzz'"),
        (["abc"], "too short: give at least 6 characters"),
        ([], "give at least one state or pair id"),
        (["--all", "abcdef12"], "give IDs or --all, not both"),
    ],
)
def test_bad_ids_exit_2_with_a_clear_message(samples_store, argv, message):
    rc, out, err = cli("show", *argv, "--store", samples_store)
    assert rc == 2 and out == ""
    assert err.startswith("composer-pipeline show: error: ") and message in err and "Traceback" not in err


def test_missing_store_and_ambiguous_prefix(tmp_path):
    rc, _, err = cli("show", "abcdef123456", "--store", tmp_path / "nothing-here")
    assert rc == 2 and "no trace_states or pair tables under" in err and "composer-pipeline ingest" in err
    with pytest.raises(ShowError, match="ambiguous.*state abcdef0001.*pair abcdef0002"):
        resolve_ids(["abcdef"], ["abcdef0001", "ffffff0001"], ["abcdef0002"], "here")
    assert resolve_ids(["ABCDEF0002", "ffffff"], ["abcdef0001", "ffffff0001"], ["abcdef0002"], "x") == [
        ("pair", "abcdef0002"),
        ("state", "ffffff0001"),
    ]


def test_s3_partitioned_layout_matches_local(moto_s3, samples_store):
    """The Dagster IO manager layout (<table>/<partition>.parquet) on a real S3-protocol server."""
    local = Store(str(samples_store))
    s3 = Store("s3://pairs-test/show-run")
    for name in ("trace_states", "trace_messages"):
        t = local.read_table(name)
        for key in sorted(set(t.column("session_key").to_pylist())):
            s3.write_table(name, t.filter(pc.equal(t.column("session_key"), key)), partition=key)
    assert len(s3.files("trace_states")) == 3
    ids = [s["state_id"] for s in local.read_table("trace_states").to_pylist()]
    remote = _json("--all", "--store", "s3://pairs-test/show-run")
    assert sorted(v["state_id"] for v in remote) == sorted(ids)
    local_views = {v["state_id"]: v for v in _json("--all", "--store", samples_store)}
    for v in remote:
        assert v == local_views[v["state_id"]]
    (one,) = _json(ids[3][:8], "--store", "s3://pairs-test/show-run")
    assert one == local_views[ids[3]]


def test_pair_whose_state_is_not_stored_shows_its_stored_prompt(replayed, tmp_path):
    only_pairs = Store(str(tmp_path / "pairs-only"))
    pairs = Store(replayed["root"]).read_table("normalized_dpo_pairs")
    only_pairs.write_table("pairs", pairs)
    p = pairs.to_pylist()[0]
    (d,) = _json(p["pair_id"], "--store", only_pairs.root)
    assert d["prefix"] == orjson.loads(p["prompt"]) and d["render"] == {"source": "pair.prompt"}
    assert any("not stored (prefix is the pair's stored prompt)" in m for m in d["missing"])
    # the replay rows live in another store: --store can be repeated
    (d2,) = _json(p["pair_id"], "--store", only_pairs.root, "--store", replayed["root"])
    assert [t["teacher"] for t in d2["teachers"]] == ["alpha", "beta"] and d2["prompt_matches_prefix"] is True


def test_in_memory_views_and_markdown_for_dagster(samples_store):
    store = Store(str(samples_store))
    views = state_views(store.read_table("trace_states"), store.read_table("trace_messages"))
    assert len(views) == 22
    v = max(views, key=lambda v: len(v.prefix))
    md = render_markdown(v)
    assert md.startswith(f"### State `{v.state_id}`") and "#### What the agent did" in md
    assert "*not replayed yet*" in md and md.count("```") % 2 == 0
    short = render_markdown(v, max_messages=2)
    assert f"*… {len(v.prefix) - 2} earlier messages not shown*" in short and len(short) < len(md)
    text = format_view(v, width=100)
    assert f"state {v.state_id}" in text and all(len(ln) <= 100 for ln in text.splitlines()[:1])


_WRITE_UNDER_A_LIMIT = """
import resource, sys
import pyarrow as pa
from upath import UPath
from composer_pipeline.store import Store

how, root, rows, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
table = pa.table({"x": pa.array(range(rows), pa.int64())})
if how != "store":
    from resources.storage import ParquetUPathIOManager  # (imports dagster: only here)

    path = UPath(root) / "replays" / "calc" / "a1f0c3d2.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    manager = ParquetUPathIOManager(base_path=UPath(root))
if limit:  # (after the imports: their caches are written first)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if how == "store":
    Store(root).write_table("replays", table)
else:
    manager.dump_to_path(None, table, path)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how,rel", [("store", "replays.parquet"), ("io_manager", "replays/calc/a1f0c3d2.parquet")])
def test_a_failed_parquet_write_leaves_the_previous_file_whole(tmp_path, how, rel):
    """``Store.write_table`` (replay, pairs, experiments) and the Dagster IO manager wrote in place: a
    write that fails (RLIMIT_FSIZE here, a full disk in production) truncated the previous file."""
    import subprocess
    import sys

    def write(rows: int, limit: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", _WRITE_UNDER_A_LIMIT, how, str(tmp_path), str(rows), str(limit)],
            capture_output=True,
            text=True,
        )

    assert write(1000, 0).returncode == 0
    before = (tmp_path / rel).read_bytes()
    p = write(200_000, len(before) * 2)
    assert p.returncode == 1 and "File too large" in p.stderr and str(tmp_path / rel) in p.stderr, p.stderr
    assert (tmp_path / rel).read_bytes() == before
    assert not [f for f in tmp_path.rglob("*") if f.name.endswith(".tmp")]
    assert write(200_000, 0).returncode == 0 and (tmp_path / rel).read_bytes() != before


def test_terminal_escapes_in_stored_text_are_escaped_and_width_is_bounded(tmp_path):
    """A folder name holding ``ESC ] 0 ; ... BEL`` (it sets the window title) became part of the session
    key, which ``sql`` and ``show`` printed raw; ``show --width 100000000`` printed 1.2 GB of rules."""
    from tests.support.sessions import Session, text, tool

    hostile = "\x1b]0;pwned\x07\x1b[2Jproj\x9b31m"
    s = Session(sid="c0ffee00-0000-4000-8000-0000000000a1")
    s.user("list the files \x1b[31mred\x1b[0m")
    s.assistant(text("ok"), tool("Bash", "t1", command="ls"))
    s.result("t1", "a b")
    s.assistant(text("done"))
    s.write(tmp_path / "traces" / hostile / "s.jsonl")
    store = tmp_path / "store"
    rc, _, err = cli("ingest", tmp_path / "traces", "--out", store)
    assert rc == 0, err
    rc, out, err = cli("sql", "select distinct session_key from trace_states", "--store", store)
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b]0;pwned\\x07\\x1b[2Jproj\\x9b31m__s" in out
    rc, out, err = cli("show", "--all", "--store", store, "--width", "100")
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mred" in out and "list the files" in out
    for width in ("100000000", "0", "-5"):
        rc, out, err = cli("show", "--all", "--store", store, "--width", width)
        assert rc == 2 and not out and "--width must be between 40 and 1000" in err, (width, err)


def test_a_failed_write_to_s3_leaves_the_previous_object(moto_s3):
    """On S3 a write that fails part way (here: the writer raises after 5 MiB, past s3fs's first
    multipart block) is discarded, not completed: the previous object stays, the error names it."""
    import pyarrow as pa

    from composer_pipeline.store import open_replacing

    store = Store("s3://pairs-test/atomic")
    store.write_table("replays", pa.table({"x": [1, 2, 3]}))
    before = store.read_table("replays")
    path = store.path("replays.parquet")

    class Full(OSError):
        pass

    with pytest.raises(OSError) as err:
        with open_replacing(store.fs, path, store.url("replays.parquet")) as f:
            f.write(b"x" * (6 << 20))
            raise Full(28, "No space left on device")
    assert err.value.filename == "s3://pairs-test/atomic/replays.parquet"
    assert store.read_table("replays").equals(before)


def test_a_session_by_its_key_or_the_short_partition_key_the_ui_shows(samples_store):
    """`show calc/a1f0c3d2` (the key the Dagster UI shows) and `show <session key>` list that session's states."""
    from composer_pipeline.ids import partition_keys

    states = Store(str(samples_store)).read_table("trace_states").to_pylist()
    session = states[0]["session_key"]
    mine = [s["state_id"] for s in states if s["session_key"] == session]
    short = partition_keys({s["session_key"] for s in states})[session]
    assert "/" in short and short != session
    assert [v["state_id"] for v in _json(short, "--store", samples_store)] == mine
    rc, out, err = cli("show", "--store", samples_store, "--json", "--", session)  # a key starting with "-": after --
    assert rc == 0, err
    assert [orjson.loads(line)["state_id"] for line in out.splitlines()] == mine
    rc, _, err = cli("show", short.split("/")[0] + "/zzzzzzzz", "--store", samples_store)
    assert rc == 2 and "no session with partition key" in err


def test_show_and_lineage_resolve_ids_with_the_same_words(samples_store, tmp_path):
    from composer_pipeline.lineage import resolve_pair_id

    store = tmp_path / "pairs"
    Store(str(store)).write_table(
        "dpo_pairs",
        Store(str(samples_store)).read_table("trace_states").select(["state_id"]).rename_columns(["pair_id"]),
    )
    errors = []
    for call in (
        lambda q: resolve_ids([q], [], ["abcdef0001", "abcdef0002"], str(store)),
        lambda q: resolve_pair_id(Store(str(store)), q),
    ):
        for q in ("abc", "zzzzzzzz"):
            with pytest.raises(ValueError) as e:
                call(q)
            errors.append(str(e.value).split(" under ")[0].replace("state or pair", "pair"))
    show_words, lineage_words = errors[:2], errors[2:]
    assert (
        show_words
        == lineage_words
        == ["id 'abc' too short: give at least 6 characters of a pair id", "no pair with id 'zzzzzzzz'"]
    )
