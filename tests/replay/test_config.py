"""teachers.yaml loading: the shipped recipes load; every malformed file is a clear ValueError."""

from __future__ import annotations

import pytest
import yaml

from composer_pipeline.teachers.config import load_teachers

GOOD = {
    "ceiling_usd": 1.0,
    "teachers": [
        {
            "name": "a",
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
            "api_key_env": "A_KEY",
            "input_usd_per_mtok": 1,
            "output_usd_per_mtok": 2,
            "budget_usd": 3,
            "max_concurrency": 2,
            "max_tokens": 64,
            "temperature": 0.2,
            "timeout_s": 5,
        }
    ],
}


def _write(tmp_path, data) -> str:
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize("name", ["teachers.yaml", "demo_teachers.yaml"])
def test_shipped_recipes_load(repo_root, name):
    cfg = load_teachers(repo_root / "recipes" / name)
    assert cfg.ceiling_usd > 0 and len(cfg.teachers) >= 2
    # entries sharing a model (base_url + model) are samples of it: sampled, each with its own seed,
    # never greedy duplicates of one answer posing as agreement (pairs.build counts them as one model)
    by_model: dict = {}
    for t in cfg.teachers:
        by_model.setdefault((t.base_url.rstrip("/"), t.model), []).append(t)
    for entries in by_model.values():
        if len(entries) > 1:
            assert all(t.temperature > 0 for t in entries) and len({t.seed for t in entries}) == len(entries), name
    # the local server serves every teacher's model
    assert set(cfg.serve) == {t.model for t in cfg.teachers}
    for t in cfg.teachers:
        assert t.input_usd_per_mtok > 0 and t.budget_usd > 0 and t.max_tokens <= 96


def test_good_config_values(tmp_path):
    cfg = load_teachers(_write(tmp_path, GOOD))
    t = cfg.teacher("a")
    assert (t.api_key_env, t.max_concurrency, t.temperature, t.timeout_s) == ("A_KEY", 2, 0.2, 5.0)
    assert t.chat_url == "http://127.0.0.1:1/v1/chat/completions"
    assert t.request_params() == {"max_tokens": 64, "temperature": 0.2}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["teachers"][0].update(colour="red"), r"teachers\[0\] \(a\): unknown keys \['colour'\]"),
        (lambda d: d["teachers"][0].pop("input_usd_per_mtok"), r"missing required key\(s\) \['input_usd_per_mtok'\]"),
        (lambda d: d["teachers"][0].pop("output_usd_per_mtok"), r"output_usd_per_mtok"),
        (lambda d: d["teachers"][0].pop("budget_usd"), r"budget_usd"),
        (lambda d: d["teachers"][0].update(input_usd_per_mtok="cheap"), r"input_usd_per_mtok must be a number"),
        (lambda d: d["teachers"][0].update(budget_usd=-1), r"budget_usd must be >= 0"),
        (lambda d: d["teachers"][0].update(max_concurrency=0), r"max_concurrency must be > 0"),
        (lambda d: d["teachers"][0].update(base_url="127.0.0.1:8000"), r"base_url must start with http"),
        (
            lambda d: d.pop("ceiling_usd"),
            r"missing required key\(s\) \['ceiling_usd'\] \(ceiling_usd: worst-case spend allowed in one replay run",
        ),
        (lambda d: d.update(retries=3), r"t\.yaml: unknown keys \['retries'\] \(allowed: \['ceiling_usd', "),
        (lambda d: d["teachers"].append(dict(d["teachers"][0])), r"duplicate teacher name\(s\) \['a'\]"),
        (lambda d: d.update(teachers=[]), r"'teachers' must be a non-empty list"),
    ],
)
def test_bad_configs_are_clear_errors(tmp_path, mutate, message):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(data)
    with pytest.raises(ValueError, match=message):
        load_teachers(_write(tmp_path, data))


def test_a_pasted_key_is_refused_without_echoing_it(tmp_path):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["teachers"][0]["api_key_env"] = "sk-or-v1-0123456789abcdef"
    with pytest.raises(ValueError, match="NAME of an environment variable") as e:
        load_teachers(_write(tmp_path, data))
    assert "0123456789abcdef" not in str(e.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_teachers(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("teachers: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_teachers(p)


def test_lease_and_cut_off_settings(tmp_path):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    cfg = load_teachers(_write(tmp_path, data))
    assert cfg.lease_s == 30.0 and cfg.max_invalid_responses == 3  # defaults
    data.update(lease_s=5, max_invalid_responses=1)
    cfg = load_teachers(_write(tmp_path, data))
    assert cfg.lease_s == 5.0 and cfg.max_invalid_responses == 1
    for key, value, message in (
        ("lease_s", 0, "lease_s must be > 0"),
        ("lease_s", 3600, "lease_s must be <= 600"),
        ("max_invalid_responses", 1.5, "must be an integer"),
    ):
        bad = {**data, key: value}
        with pytest.raises(ValueError, match=message):
            load_teachers(_write(tmp_path, bad))
