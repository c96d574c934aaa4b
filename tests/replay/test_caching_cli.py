"""The caching and fitting path through the CLI, as a user runs it: ingest long sessions → replay to three
teachers on the loopback provider emulator (one native Anthropic) → `teachers budget --json`, the replay
summary, `show`, `pairs` with `drop_fitted_answers` and `lineage` say what was billed, cached and elided."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.long_sessions import write_long_sessions
from tests.support.provider_emulator import ModelRules, ProviderEmulator


def _cli(*args, env=None, check=True):
    r = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if check:
        assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.mark.slow
def test_cli_replay_reports_billed_cached_and_elided(tmp_path):
    write_long_sessions(tmp_path / "projects", n_sessions=2, turns=24, seed=3)
    _cli("ingest", tmp_path / "projects", "--out", tmp_path / "data")
    emu = ProviderEmulator(
        {
            "gpt": ModelRules("openai", 128_000, 2.0, 8.0, 0.2),
            "claude": ModelRules("anthropic", 200_000, 3.0, 15.0, 0.3, 3.75),
            "small": ModelRules("openai", 8_000, 0.4, 1.6, 0.04),
        },
        api_key="emu-key",
    ).start()
    try:
        base = dict(api_key_env=None, budget_usd=50.0, max_concurrency=4, max_tokens=128, timeout_s=30)
        teachers = {
            "ceiling_usd": 50.0,
            "teachers": [
                dict(
                    base,
                    name="gpt",
                    base_url=emu.url,
                    model="gpt",
                    input_usd_per_mtok=2.0,
                    output_usd_per_mtok=8.0,
                    cached_input_usd_per_mtok=0.2,
                    context_window=128_000,
                ),
                dict(
                    base,
                    name="claude",
                    base_url=emu.url,
                    model="claude",
                    api="anthropic",
                    api_key_env="EMU_KEY",
                    input_usd_per_mtok=3.0,
                    output_usd_per_mtok=15.0,
                    cached_input_usd_per_mtok=0.3,
                    cache_write_usd_per_mtok=3.75,
                    context_window=200_000,
                ),
                dict(
                    base,
                    name="small",
                    base_url=emu.url,
                    model="small",
                    input_usd_per_mtok=0.4,
                    output_usd_per_mtok=1.6,
                    cached_input_usd_per_mtok=0.04,
                    context_window=8_000,
                ),
            ],
        }
        ty = tmp_path / "teachers.yaml"
        ty.write_text(yaml.safe_dump(teachers))
        env = {**os.environ, "EMU_KEY": "emu-key"}
        ledger = tmp_path / "ledger.sqlite"
        r = _cli(
            "replay",
            "--states",
            tmp_path / "data",
            "--teachers",
            ty,
            "--out",
            tmp_path / "out",
            "--ledger",
            ledger,
            "--cache",
            tmp_path / "cache",
            env=env,
        )
        summary = orjson.loads(r.stdout.strip().splitlines()[-1])
        assert summary["failed"] == 0 and summary["budget_exhausted"] == 0 and summary["fitted_answers"] > 0
        assert emu.over_window == []
        pvb = summary["predicted_vs_billed"]
        for name in ("gpt", "claude", "small"):
            assert (
                pvb[name]["billed_usd"] == round(emu.billed_usd(name), 8)
                or abs(pvb[name]["billed_usd"] - emu.billed_usd(name)) < 1e-6
            )
            assert 0 < pvb[name]["billed_usd"] <= pvb[name]["predicted_usd"] < pvb[name]["worst_case_usd"]
            assert pvb[name]["cached_prompt_tokens"] > 0
        # teachers budget --json: billed money and cached prompt tokens beside the budget figures
        b = [
            orjson.loads(x)
            for x in _cli("teachers", "budget", "--teachers", ty, "--ledger", ledger, "--json").stdout.splitlines()
        ]
        by = {x["teacher"]: x for x in b}
        assert by["claude"]["billed_usd"] == by["claude"]["settled_usd"] and by["claude"]["cached_prompt_tokens"] > 0
        assert by["gpt"]["full_price_usd"] > 3 * by["gpt"]["billed_usd"] and by["claude"]["cache_write_tokens"] > 0

        replays = pq.read_table(tmp_path / "out" / "replays.parquet").to_pylist()
        fitted = next(x for x in replays if x["teacher"] == "small" and x["elided_messages"])
        shown = _cli(
            "show", fitted["state_id"], "--store", tmp_path / "data", "--store", tmp_path / "out", "--width", "200"
        ).stdout
        assert f"{fitted['elided_messages']} messages elided before this point" in shown and "cached)" in shown

        # pairs: fitted answers are votes by default, no votes with drop_fitted_answers
        recipe = yaml.safe_load(open("recipes/pairs.yaml"))
        for drop in (False, True):
            rp = tmp_path / f"pairs-{drop}.yaml"
            rp.write_text(yaml.safe_dump({**recipe, "drop_fitted_answers": drop}))
            out = tmp_path / f"pairs-{drop}"
            r = _cli(
                "pairs",
                "--replays",
                tmp_path / "out",
                "--states",
                tmp_path / "data",
                "--teachers",
                ty,
                "--out",
                out,
                "--recipe",
                rp,
            )
            stats = orjson.loads(r.stdout.strip().splitlines()[-1])
            stats = stats["build"]
            n_fitted = sum(1 for x in replays if x["elided_messages"] or x["cut_messages"])
            assert stats["answers_fitted_dropped"] == (n_fitted if drop else 0)
        pair = pq.read_table(tmp_path / "pairs-False" / "pairs.parquet").to_pylist()
        pid = next(p["pair_id"] for p in pair if p["state_id"] == fitted["state_id"])
        chain = _cli(
            "lineage",
            pid,
            "--store",
            tmp_path / "data",
            "--store",
            tmp_path / "out",
            "--store",
            tmp_path / "pairs-False",
        ).stdout
        assert "messages elided before this point" in chain and "prompt tokens billed cached" in chain
    finally:
        emu.stop()
