"""The `ingest` CLI end to end on the bundled demo sessions, and rendering of those sessions."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from composer_pipeline.ingest import native
from composer_pipeline.ingest.discover import discover_sessions, session_fingerprint
from composer_pipeline.render import INTERRUPTED, Conversation, RenderOptions, render_state, render_states

SAMPLES_KEY_A = "-home-demo-calc__a1f0c3d2-1111-4a4a-8a8a-000000000001"
SAMPLES_KEY_C = "-home-demo-calc__c3d2e1f0-3333-4c4c-8c8c-000000000003"

# the compiled engine where it is built (test_native.py fails where a compiler is and it is not), never a skip
ENGINES = ["python", "native"] if native.AVAILABLE else ["python"]


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "composer_pipeline", "ingest", *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


@pytest.fixture(scope="module")
def cli_out(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("ingest-out")
    lines = run_cli(
        str(repo_root / "composer_pipeline/samples/projects"),
        "--out",
        str(out),
        "--recipe",
        str(repo_root / "recipes/ingest.yaml"),
    )
    return out, lines


def test_cli_writes_tables_and_reports(cli_out):
    out, lines = cli_out
    files, total = lines[:-1], lines[-1]
    assert total["total"] and total["files"] == 6 == len(files)
    assert total["states"] == 22 and total["bad_lines"] == 1 and total["warmup_dropped"] == 1
    assert total["subagents_linked"] == 2 and total["compactions_crossed"] == 1
    assert total["secrets_scrubbed"] == {"anthropic_key": 1}
    for f in files:
        assert set(f) >= {"file", "states", "bad_lines", "subagents_linked", "compactions_crossed"}
    states = pq.read_table(out / "trace_states.parquet")
    assert states.num_rows == 22 == sum(f["states"] for f in files)
    assert all(
        not p.startswith("/") and p.startswith("-home-demo-calc/") for p in states.column("source_file").to_pylist()
    )
    q = pq.read_table(out / "quarantine.parquet").to_pylist()
    assert [(r["source_file"], r["line_no"]) for r in q] == [
        ("-home-demo-calc/b2e1d4c3-2222-4b4b-8b8b-000000000002.jsonl", 9)
    ]
    msgs = pq.read_table(out / "trace_messages.parquet")
    assert "sk-ant-api03-FAKE" not in str(msgs.column("raw").to_pylist())


def test_cli_engines_write_the_same_tables(cli_out, tmp_path, repo_root):
    """--engine python (the reference) and the default (compiled where built) write equal tables; the
    totals line says which engine ran and how many sessions it handed to Python."""
    from composer_pipeline.ingest import native

    out, lines = cli_out
    ref = run_cli(
        str(repo_root / "composer_pipeline/samples/projects"),
        "--out",
        str(tmp_path),
        "--recipe",
        str(repo_root / "recipes/ingest.yaml"),
        "--engine",
        "python",
    )
    assert lines[-1]["engine"] == ("native" if native.AVAILABLE else "python")
    assert lines[-1]["python_fallback_sessions"] == 0 and "python_fallback_reasons" not in lines[-1]
    assert ref[-1]["engine"] == "python"
    assert [{k: v for k, v in r.items() if k not in ("engine", "out")} for r in ref] == [
        {k: v for k, v in r.items() if k not in ("engine", "out")} for r in lines
    ]
    for name in ("trace_states", "trace_messages", "quarantine"):
        assert pq.read_table(out / f"{name}.parquet").equals(pq.read_table(tmp_path / f"{name}.parquet")), name


def test_state_ids_stable_across_runs_and_single_file(cli_out, tmp_path, repo_root):
    out, _ = cli_out
    main = repo_root / "composer_pipeline/samples/projects/-home-demo-calc/a1f0c3d2-1111-4a4a-8a8a-000000000001.jsonl"
    lines = run_cli(str(main), "--out", str(tmp_path))
    # a single main file still brings its subagents/ directory; source_file relative to its folder
    assert [f["file"] for f in lines[:-1]] == [
        main.name,
        "a1f0c3d2-1111-4a4a-8a8a-000000000001/subagents/agent-a3c9e1f27b4d5e6f8.jsonl",
    ]
    again = run_cli(str(repo_root / "composer_pipeline/samples/projects"), "--out", str(tmp_path / "again"))
    a = pq.read_table(out / "trace_states.parquet").column("state_id").to_pylist()
    b = pq.read_table(tmp_path / "again" / "trace_states.parquet").column("state_id").to_pylist()
    assert a == b and len(set(a)) == len(a) and again[-1]["states"] == 22


def test_fingerprint_changes_with_files(tmp_path, repo_root):
    import shutil

    shutil.copytree(repo_root / "composer_pipeline/samples/projects", tmp_path / "p")
    sessions = discover_sessions(tmp_path / "p")
    assert len(sessions) == 3
    before = {s.key: session_fingerprint(s) for s in sessions}
    sub = next(s for s in sessions if s.key.endswith("0001")).subagent_files[0]
    with open(sub, "a") as f:
        f.write("\n")
    after = {s.key: session_fingerprint(s) for s in discover_sessions(tmp_path / "p")}
    assert [k for k in before if before[k] != after[k]] == [s.key for s in sessions if s.key.endswith("0001")]


def test_cli_bad_path_is_a_clear_error(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", str(tmp_path / "nope"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "no such trace path" in p.stderr


def test_samples_render(samples):
    res = samples.by_key[SAMPLES_KEY_A]
    conv = Conversation.from_table(res.messages)
    states = res.states.to_pylist()
    sub = [s for s in states if s["stream_kind"] == "subagents_dir"]
    assert len(sub) == 3 and sub[0]["parent_tool_use_id"] == "toolu_demoA04"
    first = render_state(conv, sub[0], RenderOptions()).messages
    assert first[1]["content"].startswith("Run the test suite")  # its own prompt, not the parent's
    # suboptimal actions teachers should disagree with: Edit before Read, a wrong pytest path
    assert states[0]["has_error"] and "not been read" in states[0]["error_after"]
    assert sub[0]["has_error"]
    # thinking kept in the action, stripped from prefixes by default, embedded on request
    assert "probably in mean" in json.loads(states[0]["action"])["thinking"]
    plain = render_state(conv, states[1], RenderOptions()).messages
    think = render_state(conv, states[1], RenderOptions(strip_thinking=False)).messages
    assert "<thinking>" not in json.dumps(plain) and "<thinking>The bug" in think[2]["content"]
    # tools: schemas of the tools the stream uses, with observed argument keys
    tools = render_state(conv, [s for s in states if s["stream_kind"] == "main"][-1], RenderOptions()).tools
    edit = next(t for t in tools if t["function"]["name"] == "Edit")["function"]["parameters"]["properties"]
    assert set(edit) == {"file_path", "old_string", "new_string"}
    assert "[REDACTED:anthropic_key]" in plain[1]["content"]


def test_samples_interrupt_and_compaction(samples, repo_root):
    b = samples.by_key["-home-demo-calc__b2e1d4c3-2222-4b4b-8b8b-000000000002"]
    conv = Conversation.from_table(b.messages)
    last_main = [s for s in b.states.to_pylist() if s["stream_kind"] == "main"][-1]
    msgs = render_state(conv, last_main, RenderOptions()).messages
    assert {"role": "tool", "tool_call_id": "toolu_demoB04", "content": INTERRUPTED} in msgs
    c = samples.by_key[SAMPLES_KEY_C]
    pairs = dict(render_states(c.states, c.messages, RenderOptions.from_recipe(repo_root / "recipes/ingest.yaml")))
    last = c.states.to_pylist()[-1]
    assert pairs[last["state_id"]].messages[1]["content"].startswith("This session is being continued")
    full = render_state(Conversation.from_table(c.messages), last, RenderOptions(compaction="full")).messages
    assert full[1]["content"].startswith("rename calc/stats.py") and "being continued" not in json.dumps(full)
    with pytest.raises(ValueError, match="compaction"):
        RenderOptions(compaction="sometimes")
    with pytest.raises(ValueError, match="unknown keys"):
        RenderOptions.from_recipe({"strip_thinkin": True})


def test_cli_writes_to_s3(repo_root, moto_s3):
    """--out s3://... against a real S3-protocol server (moto) on loopback; read back through Store."""
    import os

    from composer_pipeline.store import Store

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "ingest",
            str(repo_root / "composer_pipeline/samples/projects"),
            "--out",
            "s3://ingest-test/run1",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1])["out"] == "s3://ingest-test/run1"
    store = Store("s3://ingest-test/run1")
    assert store.read_table("trace_states").num_rows == 22
    assert store.read_table("quarantine").num_rows == 1


def test_agent_file_goes_to_the_session_named_by_its_id(tmp_path):
    """A resumed file (sorted first) whose head carries the other session's id must not steal its agents."""
    sid = "bbbbbbbb-0000-4000-8000-000000000002"
    d = tmp_path / "proj"
    d.mkdir()
    (d / "aaaaaaaa-0000-4000-8000-000000000001.jsonl").write_text(
        json.dumps({"type": "user", "sessionId": sid, "uuid": "u1"}) + "\n"
    )
    (d / f"{sid}.jsonl").write_text(json.dumps({"type": "user", "sessionId": sid, "uuid": "u2"}) + "\n")
    (d / "agent-a1.jsonl").write_text(
        json.dumps({"type": "user", "sessionId": sid, "agentId": "a1", "uuid": "u3"}) + "\n"
    )
    owners = {s.main_file.name: [p.name for p in s.subagent_files] for s in discover_sessions(tmp_path)}
    assert owners == {"aaaaaaaa-0000-4000-8000-000000000001.jsonl": [], f"{sid}.jsonl": ["agent-a1.jsonl"]}


def test_agent_file_whose_id_names_no_file_goes_to_the_first_main_file_carrying_it(tmp_path):
    """No file is named by the agent's sessionId: the main files' heads are read (only then) and the
    first main file, in name order, whose first records carry that id takes the agent."""
    sid = "dddddddd-0000-4000-8000-000000000004"
    d = tmp_path / "proj"
    d.mkdir()
    for name in ("cccccccc-0000-4000-8000-000000000003", "eeeeeeee-0000-4000-8000-000000000005"):
        (d / f"{name}.jsonl").write_text(json.dumps({"type": "user", "sessionId": sid, "uuid": name[:2]}) + "\n")
    (d / "ffffffff-0000-4000-8000-000000000006.jsonl").write_text(json.dumps({"type": "user", "uuid": "f"}) + "\n")
    (d / "agent-a1.jsonl").write_text(
        json.dumps({"type": "user", "sessionId": sid, "agentId": "a1", "uuid": "u3"}) + "\n"
    )
    (d / "agent-a2.jsonl").write_text(
        json.dumps({"type": "user", "sessionId": "0" * 8, "agentId": "a2", "uuid": "u4"}) + "\n"
    )
    owners = {
        s.key: ([p.name for p in s.subagent_files], s.main_file and s.main_file.name)
        for s in discover_sessions(tmp_path)
    }
    assert owners == {
        "proj__cccccccc-0000-4000-8000-000000000003": (
            ["agent-a1.jsonl"],
            "cccccccc-0000-4000-8000-000000000003.jsonl",
        ),
        "proj__eeeeeeee-0000-4000-8000-000000000005": ([], "eeeeeeee-0000-4000-8000-000000000005.jsonl"),
        "proj__ffffffff-0000-4000-8000-000000000006": ([], "ffffffff-0000-4000-8000-000000000006.jsonl"),
        "proj__00000000": (["agent-a2.jsonl"], None),  # parent not here: a session of its own
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_name_that_is_not_utf8_is_ingested_under_an_escaped_key(tmp_path, repo_root, engine):
    """A session file named in another encoding (``os`` hands its bytes over as lone surrogates) used to
    abort the whole ingest (exit 2, no rows for any session); now it is ingested under a key with the
    byte as ``%XX`` and a hash of the original name, and every other session as before."""
    import os
    import shutil

    src = repo_root / "composer_pipeline/samples/projects"
    root = tmp_path / "p"
    shutil.copytree(src, root)
    calc = root / "-home-demo-calc"
    bad_dir = os.fsencode(calc) + b"/caf\xe9-latin1.jsonl"  # "café" in Latin-1
    shutil.copy(calc / "a1f0c3d2-1111-4a4a-8a8a-000000000001.jsonl", bad_dir)
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", os.fsencode(root), "--out", str(out), "--engine", engine],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert lines[-1]["files"] == 7 and lines[-1]["python_fallback_sessions"] == 0
    keys = set(pq.read_table(out / "trace_states.parquet").column("session_key").to_pylist())
    escaped = {k for k in keys if "caf%E9-latin1~" in k}
    assert len(escaped) == 1 and SAMPLES_KEY_A in keys and SAMPLES_KEY_C in keys
    (rep,) = [r for r in lines[:-1] if "caf%E9" in r["file"]]
    assert rep["states"] > 0 and rep["file"].startswith("-home-demo-calc/caf%E9-latin1~")


@pytest.mark.parametrize("engine", ENGINES)
def test_links_and_special_files_in_the_root_are_reported_not_followed(tmp_path, repo_root, engine):
    """``x.jsonl -> /etc/passwd`` put its lines into quarantine.text and a session outside the root was
    ingested: a linked file is now listed with a quarantine row saying it was not followed, a FIFO is
    not opened (it would block), and a linked directory is not walked."""
    import os
    import shutil

    from composer_pipeline.ingest.files import NOT_FOLLOWED, NOT_REGULAR

    src = repo_root / "composer_pipeline/samples/projects/-home-demo-calc"
    outside = tmp_path / "outside"
    shutil.copytree(src, outside / "proj")
    root = tmp_path / "root"
    (root / "p").mkdir(parents=True)
    shutil.copy(src / "a1f0c3d2-1111-4a4a-8a8a-000000000001.jsonl", root / "p")
    (root / "p" / "x.jsonl").symlink_to("/etc/passwd")
    (root / "p" / "y.jsonl").symlink_to(outside / "proj" / "c3d2e1f0-3333-4c4c-8c8c-000000000003.jsonl")
    (root / "p" / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    (root / "linked").symlink_to(outside / "proj", target_is_directory=True)
    os.mkfifo(root / "p" / "fifo.jsonl")
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", str(root), "--out", str(out), "--engine", engine],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert sorted(r["file"] for r in lines[:-1]) == [
        "p/a1f0c3d2-1111-4a4a-8a8a-000000000001.jsonl",
        "p/fifo.jsonl",
        "p/gone.jsonl",
        "p/x.jsonl",
        "p/y.jsonl",
    ]
    q = pq.read_table(out / "quarantine.parquet").to_pylist()
    reasons = {r["source_file"]: r["reason"] for r in q if r["line_no"] == 0}
    assert reasons == {
        "p/x.jsonl": NOT_FOLLOWED,
        "p/y.jsonl": NOT_FOLLOWED,
        "p/gone.jsonl": NOT_FOLLOWED,
        "p/fifo.jsonl": NOT_REGULAR,
    }
    assert not any("root:" in r["text"] for r in q)
    keys = set(pq.read_table(out / "trace_states.parquet").column("session_key").to_pylist())
    assert keys == {"p__a1f0c3d2-1111-4a4a-8a8a-000000000001"}  # nothing from outside the root


def _file_size_limit(limit: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_failed_write_leaves_the_previous_output_whole_and_names_the_file(tmp_path, repo_root):
    """A write that fails (here: RLIMIT_FSIZE in the child, EFBIG, as a full disk gives ENOSPC) used to
    truncate the previous good tables in place, with an error naming no file."""
    samples = str(repo_root / "composer_pipeline/samples/projects")
    out = tmp_path / "out"
    run_cli(samples, "--out", str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    limit = len(before["trace_messages.parquet"]) // 2
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", samples, "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=_file_size_limit(limit),
    )
    assert p.returncode == 1, p.stderr
    assert f"error: {out / 'trace_messages.parquet'}: " in p.stderr and "File too large" in p.stderr, p.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # whole, and no temporary file left
