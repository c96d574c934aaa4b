"""Mixed code versions on one ledger (issue 30, item 6), on both ledgers. Older and newer code are simulated by
what they leave in the ledger (the schema version and ``min_code_version`` they record, the INSERTs they
make, the shape of the teacher identities they wrote):

* a ledger migrated by newer code that this code would misread is refused on open, with a message, before
  anything is read or bought (and by the replay CLI: exit 2, nothing sent);
* the writes of code from before schema 4 fail on a schema-4 ledger, so such code stops before it buys;
* a ledger written by older code is migrated, and its teacher identities (fewer fields) are compared field by
  field with the defaults of the fields they lack: the same teacher is served its paid answers, another one
  is still refused, naming the field.
"""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq
import pytest
import yaml
from ledger_helpers import ledger_rows

from composer_pipeline.cli import main
from composer_pipeline.ledger import CODE_VERSION, Ledger, LedgerError, LedgerTooNew, TeacherIdentityError
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, scripted_request, teacher_dict


def _from_newer_code(ledger: Ledger, need: int) -> None:
    """What newer code leaves: a later schema version, and the oldest code version it admits."""
    now = ledger._db.now
    ledger._tx(
        lambda c: (
            c.execute(f"INSERT INTO schema_migrations VALUES (?, {now})", [CODE_VERSION + 1]),
            c.execute("UPDATE ledger_meta SET value = ? WHERE key = 'min_code_version'", [str(need)]),
        )
    )


def test_a_ledger_newer_code_needs_is_refused_on_open(ledger_url):
    Ledger(ledger_url).disconnect()
    _from_newer_code(Ledger(ledger_url), CODE_VERSION + 1)
    with pytest.raises(LedgerTooNew, match=f"needs code that knows schema {CODE_VERSION + 1} or later") as e:
        Ledger(ledger_url)
    assert "Upgrade composer-pipeline on this machine" in str(e.value)


def test_the_replay_cli_refuses_a_ledger_too_new_and_sends_nothing(tmp_path, server, ledger_url, samples_dir, capsys):
    Ledger(ledger_url).disconnect()
    _from_newer_code(Ledger(ledger_url), CODE_VERSION + 1)
    teachers = tmp_path / "t.yaml"
    teachers.write_text(yaml.safe_dump({"ceiling_usd": 1.0, "teachers": [teacher_dict(server.url)]}))
    rc = main(
        [
            "replay",
            "--states",
            str(samples_dir),
            "--teachers",
            str(teachers),
            "--out",
            str(tmp_path / "o"),
            "--ledger",
            ledger_url,
            "--cache",
            str(tmp_path / "c"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Upgrade composer-pipeline on this machine" in err, err
    assert server.requests == []


def test_a_newer_schema_that_admits_this_code_is_used(tmp_path, server, ledger_url):
    """A later migration that older code can live with (it did not raise min_code_version) is not refused."""
    Ledger(ledger_url).disconnect()
    _from_newer_code(Ledger(ledger_url), CODE_VERSION)
    cfg = make_config(server.url)
    res = replay_requests(
        [scripted_request(cfg, 0)], cfg, {}, cache=ResponseCache(tmp_path / "c"), ledger=Ledger(ledger_url), run_id="r"
    )
    assert res.summary["answered"] == 1


@pytest.mark.parametrize(
    "table, insert",
    [
        # the INSERTs of the code before schema 4 (1aa49fa and earlier): no owner
        ("runs", "INSERT INTO runs VALUES ('old', 'host', 1, 'live', 30, {now}, {now}, NULL)"),
        ("claims", "INSERT INTO claims VALUES ('c1', 't', 'old', 'inflight', NULL, NULL, NULL, {now}, {now})"),
    ],
)
def test_the_writes_of_code_before_schema_4_fail(ledger_url, table, insert):
    """Such code cannot read ``min_code_version``; its first write (registering its run) fails instead, so it
    stops before it buys anything (it would re-buy what newer code paid for and share claims)."""
    ledger = Ledger(ledger_url)
    with pytest.raises(LedgerError):
        ledger._tx(lambda c: c.execute(insert.format(now=ledger._db.now)))
    assert ledger_rows(ledger, table) == []


# the identity a teacher name had on a ledger written at fceff6b: no api, no cache prices
OLD_IDENTITY = ("base_url", "model", "input_usd_per_mtok", "output_usd_per_mtok")


def _old_ledger(ledger: Ledger, cfg) -> None:
    """Rewrite the teacher identities as the older code stored them (fewer fields, sorted JSON)."""
    for t in cfg.teachers:
        old = {k: v for k, v in t.identity().items() if k in OLD_IDENTITY}
        ledger._tx(
            lambda c, t=t, old=old: c.execute(
                "UPDATE teacher_identities SET identity = ? WHERE teacher = ?",
                [orjson.dumps(old, option=orjson.OPT_SORT_KEYS).decode(), t.name],
            )
        )


def test_identities_written_by_older_code_are_compared_field_by_field(tmp_path, server, ledger_url):
    cfg = make_config(server.url)
    reqs = [scripted_request(cfg, i) for i in range(3)]
    ledger = Ledger(ledger_url)
    replay_requests(reqs, cfg, {}, cache=ResponseCache(tmp_path / "c1"), ledger=ledger, run_id="r1")
    _old_ledger(ledger, cfg)
    n = len(server.requests)
    # the same teacher: its paid answers are served (another cache: from the ledger), nothing bought again
    res = replay_requests(reqs, cfg, {}, cache=ResponseCache(tmp_path / "c2"), ledger=ledger, run_id="r2")
    assert res.summary["answered"] == 3 and len(server.requests) == n
    stored = orjson.loads(ledger_rows(ledger, "teacher_identities")[0]["identity"])
    assert stored == cfg.teachers[0].identity()  # stored in full from now on
    # another model under the name, or cache prices the older identity did not have: refused, naming the field
    _old_ledger(ledger, cfg)
    for over, field in (
        ({"model": "other"}, "model: recipe 'other', ledger 'scripted'"),
        ({"cached_input_usd_per_mtok": 0.1}, "cached_input_usd_per_mtok: recipe 0.1, ledger 1.0"),
    ):
        other = make_config(server.url, **over)
        with pytest.raises(TeacherIdentityError, match=field):
            replay_requests(reqs, other, {}, cache=ResponseCache(tmp_path / "c3"), ledger=ledger, run_id="r3")
    assert len(server.requests) == n


def test_an_older_ledger_is_served_by_newer_code_through_the_cli(tmp_path, server, ledger_url, samples_dir):
    """The reverse direction end to end: a ledger (identities of the older shape) replayed by this code's CLI
    with another cache buys nothing again."""
    teachers = tmp_path / "t.yaml"
    teachers.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict(server.url)]}))

    def replay(out: str, cache: str) -> int:
        return main(
            [
                "replay",
                "--states",
                str(samples_dir),
                "--teachers",
                str(teachers),
                "--out",
                str(tmp_path / out),
                "--ledger",
                ledger_url,
                "--cache",
                str(tmp_path / cache),
            ]
        )

    assert replay("o1", "c1") == 0
    _old_ledger(Ledger(ledger_url), make_config(server.url))
    n = len(server.requests)
    assert replay("o2", "c2") == 0 and len(server.requests) == n
    rows = pq.read_table(tmp_path / "o2" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"} and all(r["paid_usd"] == 0 for r in rows)


def test_an_identity_stored_with_the_base_url_password_matches_and_loses_it(ledger_url):
    """Code from before base_url's user info became basic auth stored the URL as the recipe gave it: the same
    teacher still matches (its identity now holds the plain URL), the stored identity is rewritten without
    the password, and a clash message never prints it."""
    cfg = make_config("http://127.0.0.1:9/v1")
    ident = cfg.teachers[0].identity()
    ledger = Ledger(ledger_url)
    old = {**ident, "base_url": "http://vllm:s3cr3t-pw@127.0.0.1:9/v1"}
    ledger._tx(
        lambda c: c.execute(
            f"INSERT INTO teacher_identities VALUES (?, ?, {ledger._db.now})",
            [cfg.teachers[0].name, orjson.dumps(old, option=orjson.OPT_SORT_KEYS).decode()],
        )
    )
    other = {**ident, "model": "other"}
    with pytest.raises(TeacherIdentityError) as e:
        ledger.check_identities({cfg.teachers[0].name: other}, register=False)
    assert "s3cr3t-pw" not in str(e.value) and "model: recipe 'other'" in str(e.value)
    ledger.check_identities({cfg.teachers[0].name: ident})
    stored = ledger_rows(ledger, "teacher_identities")[0]["identity"]
    assert "s3cr3t-pw" not in stored and orjson.loads(stored) == ident
