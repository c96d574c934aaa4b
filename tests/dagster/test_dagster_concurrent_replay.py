"""Concurrent Dagster runs of the replay chain, no concurrency pool configured: three run processes on
one persistent (default, SQLite) instance, one ledger and one cache, two distinct sessions plus a
second run of the first one at the same time. Every run succeeds with its checks passing (waiting
for money or for another run's answer is not an error), and every distinct request is bought once."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from dagster_sessions import session_lines, write_teachers_yaml
from ledger_helpers import ledger_rows

from composer_pipeline.ledger import Ledger

# concurrent Dagster runs against one ledger
pytestmark = pytest.mark.slow

SIDS = [f"{k}1111111-2222-3333-4444-555555555555" for k in range(2)]

_RUN = textwrap.dedent("""
    import json, sys
    import dagster as dg
    from assets.ingest import ingest_session_tables, raw_sessions
    from assets.replay import cost_plan, cost_plan_within_budget, teacher_replays
    from resources.ledger import LedgerResource
    from resources.recipes import PipelineRecipes
    from resources.storage import ParquetIOManager
    from resources.teachers import TeachersResource
    a = json.loads(sys.argv[1])
    res = dg.materialize(
        [raw_sessions, ingest_session_tables, cost_plan, cost_plan_within_budget, teacher_replays],
        partition_key=a["key"], instance=dg.DagsterInstance.get(), raise_on_error=False,
        resources={"io_manager": ParquetIOManager(root=a["store"]), "recipes": PipelineRecipes(trace_root=a["root"]),
                   "teachers": TeachersResource(recipe=a["teachers"], cache_dir=a["cache"]),
                   "ledger": LedgerResource(path=a["ledger"])})
    checks = {e.check_name: bool(e.passed) for e in res.get_asset_check_evaluations()}
    meta = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    summary = meta["teacher_replays"]["summary"].value if "teacher_replays" in meta else {}
    print(json.dumps({"success": res.success, "checks": checks, "summary": summary}))
""")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_partitions_without_a_pool(backend, tmp_path, scripted_server, repo_root, request):
    """Same semantics on both ledgers: the embedded SQLite file and a shared PostgreSQL."""
    import dagster as dg

    scripted_server.latency_s = 0.1
    root = tmp_path / "projects"
    for sid in SIDS:
        (root / "-home-dev-proj").mkdir(parents=True, exist_ok=True)
        (root / "-home-dev-proj" / f"{sid}.jsonl").write_text("\n".join(session_lines(sid, 3)) + "\n")
    keys = [f"-home-dev-proj__{sid}" for sid in SIDS]
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PYTHONPATH": f"{repo_root}:{repo_root / 'tests' / 'dagster'}",
        "OMP_NUM_THREADS": "1",
    }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("sessions", keys)
    teachers = write_teachers_yaml(tmp_path / "teachers.yaml", scripted_server.url, n=2)
    if backend == "sqlite":
        ledger_path = str(tmp_path / "ledger.sqlite")
    else:
        ledger_path = request.getfixturevalue("postgres_server").create_database(
            f"ledger_{tmp_path.name[-20:].lower()}"
        )
    procs = []
    for k, key in enumerate([keys[0], keys[1], keys[0]]):  # keys[0] twice, at the same time
        a = {
            "key": key,
            "store": str(tmp_path / f"store{k}"),
            "root": str(root),
            "teachers": str(teachers),
            "cache": str(tmp_path / "cache"),
            "ledger": str(ledger_path),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _RUN, json.dumps(a)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(repo_root),
            )
        )
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["success"] and all(r["checks"].values()), r
        assert r["summary"]["answered"] == r["summary"]["rows"] > 0 and r["summary"]["budget_exhausted"] == 0
    # one purchase per distinct request (call_id) over all three runs; the same prefix in two sessions and the
    # duplicate run took the answer from the ledger or the cache
    led = Ledger(ledger_path)
    claims = ledger_rows(led, "claims")
    assert {c["state"] for c in claims} == {"answered"}
    assert len(scripted_server.requests) == len(claims) < sum(r["summary"]["rows"] for r in results)
    assert sum(r["summary"]["http_requests"] for r in results) == len(claims)
    assert led.open_reservations() == 0 and {r["state"] for r in ledger_rows(led, "runs")} == {"closed"}
