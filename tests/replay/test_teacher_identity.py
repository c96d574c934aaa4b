"""A teacher name stands for one identity (base_url, model, prices) on a ledger, and a call id for one
request to one endpoint: the same name and model at another endpoint calls its own endpoint, a recipe
reusing a known name for another identity is refused (exit 2, naming both), answers bought under the
ids of earlier versions are still served, and a ledger of schema 1 is migrated in place."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import yaml
from ledger_helpers import ledger_rows, schema_version

from composer_pipeline.cli import main
from composer_pipeline.ledger import MIGRATIONS, Ledger, TeacherIdentityError
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache, legacy_call_id
from tests.support.scripted_server import ScriptedServer

from .conftest import make_config, scripted_request, teacher_dict


@pytest.fixture
def server2():
    srv = ScriptedServer().start()
    yield srv
    srv.stop()


def _yaml(path, url, **over):
    path.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict(url, "t1", **over)]}))
    return str(path)


def _replay(tmp_path, samples_dir, teachers, out, ledger, cache) -> int:
    return main(
        [
            "replay",
            "--states",
            str(samples_dir),
            "--teachers",
            teachers,
            "--out",
            str(tmp_path / out),
            "--ledger",
            ledger,
            "--cache",
            str(tmp_path / cache),
        ]
    )


def test_same_name_and_model_at_another_endpoint_calls_that_endpoint(
    tmp_path, server, server2, samples_dir, ledger_url, capsys
):
    """Shared response cache, separate ledgers: the second endpoint is asked every question itself."""
    a = _yaml(tmp_path / "a.yaml", server.url)
    b = _yaml(tmp_path / "b.yaml", server2.url)
    assert _replay(tmp_path, samples_dir, a, "out_a", ledger_url, "cache") == 0
    n = len(server.requests)
    assert n > 0
    assert _replay(tmp_path, samples_dir, b, "out_b", str(tmp_path / "other.sqlite"), "cache") == 0
    assert len(server2.requests) == n and len(server.requests) == n
    rows_a = pq.read_table(tmp_path / "out_a" / "replays.parquet").to_pylist()
    rows_b = pq.read_table(tmp_path / "out_b" / "replays.parquet").to_pylist()
    assert not {r["call_id"] for r in rows_a} & {r["call_id"] for r in rows_b}
    assert not any(r["cache_hit"] for r in rows_b)


def test_a_known_name_reused_for_another_identity_is_refused(
    tmp_path, server, server2, samples_dir, ledger_url, capsys
):
    a = _yaml(tmp_path / "a.yaml", server.url)
    assert _replay(tmp_path, samples_dir, a, "out_a", ledger_url, "cache") == 0
    capsys.readouterr()
    for over, url in (
        ({}, server2.url),
        ({"model": "other-model"}, server.url),
        ({"output_usd_per_mtok": 9.0}, server.url),
    ):
        b = _yaml(tmp_path / "b.yaml", url, **over)
        n1, n2 = len(server.requests), len(server2.requests)
        assert _replay(tmp_path, samples_dir, b, "out_b", ledger_url, "cache_b") == 2
        err = capsys.readouterr().err
        assert "teacher 't1'" in err and server.url in err and err.count('"base_url"') == 2, err
        assert (len(server.requests), len(server2.requests)) == (n1, n2)  # nothing sent
    # the same identity with a higher budget is the same teacher: it runs (and shares its spend)
    assert (
        _replay(
            tmp_path, samples_dir, _yaml(tmp_path / "c.yaml", server.url, budget_usd=20.0), "out_c", ledger_url, "cache"
        )
        == 0
    )
    # the library path refuses it too, before any reservation
    with pytest.raises(TeacherIdentityError):
        cfg = make_config(server2.url)
        replay_requests(
            [scripted_request(cfg, 0)],
            cfg,
            {},
            cache=ResponseCache(tmp_path / "c2"),
            ledger=Ledger(ledger_url),
            run_id="x",
        )
    assert not any(r["run_id"] == "x" for r in ledger_rows(Ledger(ledger_url), "reservations"))


def test_answers_bought_under_earlier_call_ids_are_served(tmp_path, server, ledger_url):
    """An earlier version keyed answers by teacher|model|body: its cache files and its ledger answers are
    served to the teacher holding the name (no request, no spend)."""
    cfg = make_config(server.url)
    reqs = [scripted_request(cfg, i) for i in range(4)]
    ledger = Ledger(ledger_url)
    res = replay_requests(reqs, cfg, {}, cache=ResponseCache(tmp_path / "c1"), ledger=ledger, run_id="r1")
    assert res.summary["http_requests"] == 4
    # rewrite what that run stored under the legacy ids (what an earlier version would have left)
    old_cache = ResponseCache(tmp_path / "old")
    for r in reqs[:2]:
        old_cache.put(legacy_call_id("t1", "scripted", r.body), ResponseCache(tmp_path / "c1").get(r.call_id))
    legacy = {r.call_id: legacy_call_id("t1", "scripted", r.body) for r in reqs[2:]}
    ledger._tx(
        lambda c: [
            c.execute("UPDATE claims SET call_id = ? WHERE call_id = ?", [new, old]) for old, new in legacy.items()
        ]
    )
    n = len(server.requests)
    res2 = replay_requests(reqs, cfg, {}, cache=old_cache, ledger=ledger, run_id="r2")
    assert len(server.requests) == n and res2.summary["answered"] == 4 and res2.summary["spend_usd"] == 0


def test_a_schema_1_ledger_is_migrated_and_keeps_its_spend(tmp_path, server, ledger_url):
    cfg = make_config(server.url)
    ledger = Ledger(ledger_url)
    replay_requests(
        [scripted_request(cfg, 0)], cfg, {}, cache=ResponseCache(tmp_path / "c"), ledger=ledger, run_id="r1"
    )
    spent = ledger.spent("t1")
    assert spent > 0 and schema_version(ledger) == MIGRATIONS[-1][0] >= 4
    ledger._tx(
        lambda c: (
            c.execute("DROP TABLE batch_calls"),  # schema 5
            c.execute("DROP TABLE batches"),
            c.execute("DROP TABLE ledger_meta"),
            c.execute("ALTER TABLE runs DROP COLUMN owner"),
            c.execute("ALTER TABLE runs DROP COLUMN machine"),
            c.execute("ALTER TABLE claims DROP COLUMN owner"),
            c.execute("DROP TABLE billed_usage"),
            c.execute("DROP TABLE teacher_identities"),
            c.execute("DELETE FROM schema_migrations WHERE version > 1"),
        )
    )
    ledger.disconnect()
    again = Ledger(ledger_url)
    assert schema_version(again) == MIGRATIONS[-1][0] and again.spent("t1") == spent
    res = replay_requests(
        [scripted_request(cfg, 0), scripted_request(cfg, 1)],
        cfg,
        {},
        cache=ResponseCache(tmp_path / "c"),
        ledger=again,
        run_id="r2",
    )
    assert res.summary["from_cache"] == 1 and res.summary["http_requests"] == 1
    assert [r["teacher"] for r in ledger_rows(again, "teacher_identities")] == ["t1"]
