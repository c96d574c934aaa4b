"""API keys as operators really paste them and teachers really echo them: surrounding whitespace is
stripped at load, a key with a control character inside is refused before anything is reserved, a
request httpx cannot form is released (nothing was sent), and a key the teacher echoes anywhere in its
answer never reaches the cache, the ledger, the replay table, the output or ``show``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest
import yaml
from ledger_helpers import ORDER, ledger_rows

from composer_pipeline.cli import main
from composer_pipeline.ledger import AsyncLedger, Ledger
from composer_pipeline.replay.call import call_teacher, make_http_client
from composer_pipeline.replay.run import replay_requests
from composer_pipeline.teachers.cache import ResponseCache

from .conftest import make_config, scripted_request, teacher_dict

# a self-hosted gateway's key: no known prefix, so only its literal value can find it
KEY = "gwQ7f9Lm2Rx4Tz8Vb1Nc6Hd3Jk5Pw0Sa"


def _yaml(tmp_path: Path, url: str, **over) -> str:
    p = tmp_path / "teachers.yaml"
    p.write_text(
        yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict(url, "t1", api_key_env="GW_KEY", **over)]})
    )
    return str(p)


def _run(tmp_path, samples_dir, teachers, ledger_url, out="out") -> int:
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
            ledger_url,
            "--cache",
            str(tmp_path / "cache"),
        ]
    )


def _ledger_text(ledger: Ledger) -> str:
    return json.dumps({t: ledger_rows(ledger, t) for t in ("reservations", "claims", "runs")}, default=str)


@pytest.mark.parametrize("pasted", [KEY + "\n", KEY + "\r\n", KEY + "\t", "  " + KEY + " "])
def test_a_pasted_key_with_surrounding_whitespace_is_stripped(
    pasted, tmp_path, server, samples_dir, ledger_url, monkeypatch
):
    monkeypatch.setenv("GW_KEY", pasted)
    assert _run(tmp_path, samples_dir, _yaml(tmp_path, server.url), ledger_url) == 0
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"}
    assert {r.authorization for r in server.requests} == {f"Bearer {KEY}"}
    ledger = Ledger(ledger_url)
    assert {r["state"] for r in ledger_rows(ledger, "reservations")} == {"settled"}


def test_a_key_with_a_control_character_inside_is_refused_before_any_reservation(
    tmp_path, server, samples_dir, ledger_url, monkeypatch, capsys
):
    monkeypatch.setenv("GW_KEY", KEY[:10] + "\n" + KEY[10:])
    assert _run(tmp_path, samples_dir, _yaml(tmp_path, server.url), ledger_url) == 2
    err = capsys.readouterr().err
    assert "GW_KEY" in err and "control character" in err and KEY[:10] not in err
    assert not server.requests and ledger_rows(Ledger(ledger_url), "reservations") == []


def test_a_request_httpx_refuses_to_form_is_released_not_kept(tmp_path, server, ledger_url):
    """Defence in depth below the loader: a header value HTTP forbids means nothing was sent."""
    cfg = make_config(server.url, api_key_env="GW_KEY")
    t = cfg.teachers[0]
    req = scripted_request(cfg, 0)
    ledger = Ledger(ledger_url)

    async def go():
        al = AsyncLedger(ledger, "r")
        await al.start()
        assert (await al.claim(req.call_id, t.name)).state == "mine"  # call_teacher's caller holds the claim
        http = make_http_client(t)
        try:
            return await call_teacher(
                http,
                t,
                KEY + "\n",
                req.body,
                req.call_id,
                ledger=al,
                cache=ResponseCache(tmp_path / "c"),
                run_id="r",
                ceiling_usd=5.0,
                semaphore=asyncio.Semaphore(1),
            )
        finally:
            await http.aclose()
            await al.finish()

    res = asyncio.run(go())
    assert res.status == "failed" and res.reason.startswith("request_refused") and res.cost_usd == 0
    assert KEY not in res.reason and not server.requests
    assert {r["state"] for r in ledger_rows(ledger, "reservations")} == {"released"}
    assert ledger.balance("t1", 10.0).spent_usd == 0
    assert KEY not in _ledger_text(ledger)


def test_a_teacher_echoing_its_own_key_is_stored_nowhere(
    tmp_path, server, samples_dir, ledger_url, monkeypatch, capsys
):
    """The loopback teacher repeats the key it received in the answer text (also URL-encoded), in a tool
    call's arguments and in ``system_fingerprint``; a trailing newline on the pasted key changes nothing."""
    monkeypatch.setenv("GW_KEY", KEY + "\n")
    server.default_script = ["echokey"]
    assert _run(tmp_path, samples_dir, _yaml(tmp_path, server.url), ledger_url) == 0
    assert server.requests and {r.authorization for r in server.requests} == {f"Bearer {KEY}"}
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"}
    assert any("[REDACTED]" in (r["raw_answer"] or "") for r in rows)
    forms = [KEY, quote(KEY, safe="")]
    ledger = Ledger(ledger_url)
    texts = {"ledger": _ledger_text(ledger), "replays": json.dumps(rows, default=str)}
    for p in [*(tmp_path / "cache").rglob("*"), *(tmp_path / "out").rglob("*"), *tmp_path.glob("*.sqlite*")]:
        if p.is_file():
            texts[str(p)] = p.read_bytes().decode("latin-1")
    # show prints the replays of a state from the store, answers included
    assert (
        main(["show", rows[0]["state_id"], "--store", str(samples_dir), "--store", str(tmp_path / "out"), "--json"])
        == 0
    )
    out, err = capsys.readouterr()
    texts["stdout"], texts["stderr"] = out, err
    assert rows[0]["call_id"][:8] in out or rows[0]["state_id"] in out
    leaks = [where for where, text in texts.items() for f in forms if f in text]
    assert not leaks, leaks


def test_echoed_key_in_the_library_path_too(tmp_path, server, ledger_url):
    cfg = make_config(server.url, api_key_env="GW_KEY")
    cache = ResponseCache(tmp_path / "c")
    res = replay_requests(
        [scripted_request(cfg, 0, "echokey")], cfg, {"t1": KEY}, cache=cache, ledger=Ledger(ledger_url), run_id="r"
    )
    row = res.table.to_pylist()[0]
    assert row["status"] == "answered" and KEY not in json.dumps(row, default=str)
    rec = cache.get(row["call_id"])
    assert rec["response"]["system_fingerprint"] == "[REDACTED]"
    assert KEY not in json.dumps(rec) and KEY not in json.dumps(Ledger(ledger_url).answer(row["call_id"]))


# a gateway key as long as an Anthropic key, with slashes (base64-like): only its value can find it
LONG_KEY = "gw/" + "Q7f9Lm2Rx4/Tz8Vb1Nc6" * 5


def _everything_stored(tmp_path: Path, ledger_url: str, capsys, rows: list[dict], samples_dir: Path) -> dict[str, str]:
    """Every text a run leaves: each ledger table, the cache, the output, the SQLite files, what ``show``
    prints of the first replayed state, stdout and stderr."""
    ledger = Ledger(ledger_url)
    texts = {t: json.dumps(ledger_rows(ledger, t), default=str) for t in ORDER}
    texts["replays"] = json.dumps(rows, default=str)
    for p in [*(tmp_path / "cache").rglob("*"), *(tmp_path / "out").rglob("*"), *tmp_path.glob("*.sqlite*")]:
        if p.is_file():
            texts[str(p)] = p.read_bytes().decode("latin-1")
    out, err = capsys.readouterr()
    texts["run stdout"], texts["run stderr"] = out, err
    show = ["show", rows[0]["state_id"], "--store", str(samples_dir), "--store", str(tmp_path / "out"), "--json"]
    assert main(show) == 0
    texts["show stdout"], texts["show stderr"] = capsys.readouterr()
    return texts


def _pieces(key: str, n: int = 12) -> list[str]:
    """Every run of ``n`` characters of the key: no part of it may be stored."""
    return [key[i : i + n] for i in range(len(key) - n + 1)]


def test_a_key_echoed_in_php_escaped_tool_arguments_is_stored_nowhere(
    tmp_path, server, samples_dir, ledger_url, monkeypatch, capsys
):
    """PHP's ``json_encode`` writes ``/`` as ``\\/``: tool-call arguments echoing a key with slashes held
    it in a form the literal forms missed, and decoding the arguments put the whole key in the
    replay table's ``action`` and in ``show``."""
    monkeypatch.setenv("GW_KEY", LONG_KEY)
    server.default_script = ["echokeyphp"]
    assert _run(tmp_path, samples_dir, _yaml(tmp_path, server.url), ledger_url) == 0
    assert {r.authorization for r in server.requests} == {f"Bearer {LONG_KEY}"}
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"}
    assert all("[REDACTED]" in json.dumps(r["action"]) for r in rows)
    texts = _everything_stored(tmp_path, ledger_url, capsys, rows, samples_dir)
    leaks = [(where, piece) for where, text in texts.items() for piece in _pieces(LONG_KEY) if piece in text]
    assert not leaks, leaks[:3]


def test_a_plain_text_answer_echoing_the_key_is_redacted_before_it_is_cut(
    tmp_path, server, samples_dir, ledger_url, monkeypatch, capsys
):
    """A 200 whose body is ``Invalid key: <key> ...`` (not JSON) is quoted in the reason, the ledger note
    and stderr, cut to 60 characters: cut first, the key's first 47 characters matched nothing and
    stayed. Redacted first, nothing of the key is left."""
    monkeypatch.setenv("GW_KEY", LONG_KEY)
    server.default_script = ["invalidkey"]
    _run(tmp_path, samples_dir, _yaml(tmp_path, server.url), ledger_url)
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    reasons = [r["reason"] for r in rows if (r["reason"] or "").startswith("invalid_json")]
    assert reasons and all("Invalid key: [REDACTED]" in r for r in reasons)
    texts = _everything_stored(tmp_path, ledger_url, capsys, rows, samples_dir)
    leaks = [(where, piece) for where, text in texts.items() for piece in _pieces(LONG_KEY) if piece in text]
    assert not leaks, leaks[:3]


def test_user_info_in_base_url_goes_only_into_the_basic_auth_header(
    tmp_path, server, samples_dir, ledger_url, monkeypatch, capsys
):
    """``http://user:password@host/v1`` (basic auth in front of a local server): the password put in the
    ledger's ``teacher_identities`` and every response-cache record. It is now sent as basic auth and
    nowhere else: every stored form of the URL is the URL without it."""
    import base64

    password = "Pw9Basic7AuthSecret"
    url = server.url.replace("http://", f"http://vllm-user:{password}@")
    teachers = tmp_path / "teachers.yaml"
    teachers.write_text(yaml.safe_dump({"ceiling_usd": 5.0, "teachers": [teacher_dict(url, "t1")]}))
    assert _run(tmp_path, samples_dir, str(teachers), ledger_url) == 0
    token = base64.b64encode(f"vllm-user:{password}".encode()).decode()
    assert server.requests and {r.authorization for r in server.requests} == {f"Basic {token}"}
    rows = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
    assert rows and {r["status"] for r in rows} == {"answered"}
    identities = ledger_rows(Ledger(ledger_url), "teacher_identities")
    assert [json.loads(r["identity"])["base_url"] for r in identities] == [server.url]
    records = [json.loads(p.read_text()) for p in (tmp_path / "cache").rglob("*.json")]
    assert records and {r["base_url"] for r in records} == {server.url}
    texts = _everything_stored(tmp_path, ledger_url, capsys, rows, samples_dir)
    leaks = [where for where, text in texts.items() if password in text or token in text]
    assert not leaks, leaks
