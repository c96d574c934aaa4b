"""A USD amount on the command line is a finite number >= 0, refused at argument parsing otherwise
(a nan ceiling compared false with every cost: the replay waited forever with 0 calls)."""

import pytest

from composer_pipeline.cli import main
from composer_pipeline.teachers.config import parse_teachers


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-0.5", "five"])
def test_replay_refuses_a_ceiling_that_is_not_a_finite_amount(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["replay", "--states", str(tmp_path), "--teachers", "t.yaml", "--out", str(tmp_path / "o"),
              f"--ceiling-usd={value}"])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--ceiling-usd" in err and ("finite amount in USD" in err or "not an amount" in err)


@pytest.mark.parametrize("key", ["ceiling_usd", "budget_usd", "input_usd_per_mtok"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_the_teachers_recipe_refuses_the_same_amounts(key, value):
    teacher = dict(name="a", base_url="http://127.0.0.1:1/v1", model="m", api_key_env=None,
                   input_usd_per_mtok=1.0, output_usd_per_mtok=1.0, budget_usd=1.0, max_concurrency=1)  # fmt: skip
    data = {"ceiling_usd": 1.0, "teachers": [teacher]}
    (data if key == "ceiling_usd" else teacher)[key] = value
    with pytest.raises(ValueError, match=key):
        parse_teachers(data, "t.yaml")
