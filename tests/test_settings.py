"""The one settings layer (composer_pipeline/settings.py): every recipe under recipes/ loads through it,
docs/SETTINGS.md is generated from its dataclasses (and equal to what they say now), and its rules
(unknown keys, missing keys, types, where an error is) hold for every recipe alike.

Regenerate the reference after changing a setting: ``python tests/test_settings.py`` (from the repo root).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script to regenerate the docs
    sys.path.insert(0, str(REPO))

from assets.settings import PipelineFile, load_settings  # noqa: E402
from composer_pipeline import settings  # noqa: E402
from composer_pipeline.experiments.read_before_edit.config import ExperimentConfig, load_config  # noqa: E402
from composer_pipeline.ingest.config import IngestRecipe  # noqa: E402
from composer_pipeline.pairs.config import NormalizeFile, NormalizeRecipe, PairRecipe  # noqa: E402
from composer_pipeline.teachers.config import TeachersConfig, load_teachers  # noqa: E402
from composer_pipeline.train.config import TrainRecipe  # noqa: E402

DOC = REPO / "docs" / "SETTINGS.md"

# recipe file -> (its settings dataclass, the loader the pipeline reads it with, who calls that loader)
RECIPES = {
    "pipeline.yaml": (PipelineFile, load_settings, "`assets/settings.py` `load_settings` (Dagster layer)"),
    "cluster.yaml": (PipelineFile, load_settings, "the same, as `COMPOSER_PIPELINE_RECIPE` (docs/SCALING.md)"),
    "ingest.yaml": (IngestRecipe, IngestRecipe.load, "`ingest/config.py` `IngestRecipe.load`"),
    "teachers.yaml": (TeachersConfig, load_teachers, "`teachers/config.py` `load_teachers`"),
    "demo_teachers.yaml": (TeachersConfig, load_teachers, "the same"),
    "pairs.yaml": (PairRecipe, PairRecipe.load, "`pairs/config.py` `PairRecipe.load`"),
    "normalize.yaml": (NormalizeFile, NormalizeRecipe.load, "`pairs/config.py` `NormalizeRecipe.load`"),
    "normalize_ray.yaml": (NormalizeFile, NormalizeRecipe.load, "the same (`executor_type: ray`)"),
    "train.yaml": (TrainRecipe, TrainRecipe.load, "`train/config.py` `TrainRecipe.load`"),
}
# the experiment's presets (composer-pipeline experiment read-before-edit --recipe NAME)
PRESETS = "experiments/read_before_edit"
RECIPES |= {
    f"{PRESETS}/default.yaml": (
        ExperimentConfig,
        load_config,
        "`experiments/read_before_edit/config.py` `load_config` (`experiment read-before-edit --recipe default`)",
    ),
    **{
        f"{PRESETS}/{name}.yaml": (ExperimentConfig, load_config, f"the same (`--recipe {name}`)")
        for name in ("quick", "fmt", "smollm2", "smollm2_plan")
    },
}
# Dagster's own instance files (dagster.yaml variants): Dagster's schema reads them (tests/scaling)
NOT_OURS = {"dagster"}


def generate() -> str:
    out = [
        "# Settings reference",
        "",
        "Generated from the settings dataclasses by `python tests/test_settings.py`; `tests/test_settings.py`",
        "fails when this file and the code disagree. Every recipe is read by one loader",
        "(`composer_pipeline/settings.py`): an unknown key is an error naming the file, the section and the",
        "allowed keys; values are type-checked. Each setting has one home: the file and key below.",
        "",
    ]
    seen: dict[type, str] = {}
    for name, (cls, _, reader) in RECIPES.items():
        out += [f"## `recipes/{name}`", "", f"Read by {reader}; dataclass `{cls.__module__}.{cls.__qualname__}`.", ""]
        if cls in seen:
            out += [f"Same settings as `recipes/{seen[cls]}`.", ""]
            continue
        seen[cls] = name
        out += [settings.document(cls), ""]
    return "\n".join(out)


def test_every_recipe_file_is_known():
    root = REPO / "recipes"
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    present = {name for name in present if name.split("/")[0] not in NOT_OURS}
    assert present == set(RECIPES), (
        f"recipes/ has {sorted(present - set(RECIPES))} unknown to this test, lacks {sorted(set(RECIPES) - present)}"
    )


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_loads_through_the_layer(name):
    cls, loader, _ = RECIPES[name]
    path = REPO / "recipes" / name
    loaded = loader(path)
    assert loaded is not None
    # the file as the layer reads it: no key outside the dataclass, every value of its type
    assert isinstance(settings.from_dict(cls, settings.read_yaml(path), str(path)), cls)


def test_settings_doc_matches_the_dataclasses():
    assert DOC.read_text() == generate() + "\n", "docs/SETTINGS.md is stale: run `python tests/test_settings.py`"


def test_one_rule_for_unknown_keys_everywhere(tmp_path):
    cases = [
        (TrainRecipe, {"optim": {"stepz": 1}}, "optim", "stepz"),
        (IngestRecipe, {"render": {"strip_thinkin": True}}, "render", "strip_thinkin"),
        (PairRecipe, {"signature": {"ignore_order": True}}, "signature", "ignore_order"),
        (PipelineFile, {"checks": {"max_quarantine": 5}}, "checks", "max_quarantine"),
        (PipelineFile, {"deployment": {"trainer": {"k8s": {"imag": "x"}}}}, "deployment.trainer.k8s", "imag"),
        (NormalizeFile, {"procces": []}, "", "procces"),
    ]
    for cls, raw, section, key in cases:
        p = tmp_path / "r.yaml"
        import yaml

        p.write_text(yaml.safe_dump(raw))
        with pytest.raises(ValueError) as e:
            settings.load(cls, p)
        msg = str(e.value)
        assert msg.startswith(f"{p}: {section + ': ' if section else ''}unknown keys ['{key}'] (allowed: ["), msg


def test_types_are_checked_with_the_key_path(tmp_path):
    for raw, msg in [
        ({"optim": {"steps": "10"}}, "optim.steps must be an integer, got '10'"),
        ({"optim": {"steps": True}}, "optim.steps must be an integer, got True"),
        ({"weights": {"sdpo": "half"}}, "weights.sdpo must be a number, got 'half'"),
        ({"lora": {"enabled": "yes"}}, "lora.enabled must be true or false, got 'yes'"),
        ({"grpo": {"rewards": "valid_action"}}, "grpo.rewards must be a list, got 'valid_action'"),
        ({"grpo": {"rewards": [1]}}, "grpo.rewards[0] must be a string, got 1"),
        ({"dpo": {"variant": "ipo"}}, "dpo.variant must be one of ['dpo', 'simpo', 'dpop'], got 'ipo'"),
        ({"model": 3}, "model must be str | null, got 3"),
        ({"sdpo": []}, "sdpo: expected a mapping, got list"),
    ]:
        with pytest.raises(ValueError) as e:
            TrainRecipe.from_dict(raw)
        assert str(e.value) == f"train recipe: {msg}"
    # a key whose entries are all commented out (YAML null): an empty list / mapping, a section's defaults
    assert TrainRecipe.from_dict({"grpo": {"rewards": None}, "eval": None}).grpo.rewards == []
    assert TrainRecipe.from_dict({"eval": None}).eval == TrainRecipe().eval
    assert TrainRecipe.from_dict({"grpo": {"reward_weights": None}}).grpo.reward_weights is None  # optional: stays null
    r = TrainRecipe.from_dict({"weights": {"sdpo": 1}, "optim": {"steps": 4.0}})  # int -> float, whole float -> int
    assert (type(r.weights.sdpo), r.optim.steps, type(r.optim.steps)) == (float, 4, int)
    assert TrainRecipe.from_dict(settings.to_dict(r)) == r


def test_trainer_pod_settings_are_typed(tmp_path):
    """The k8s trainer pod is a typed section (resources/trainer.py ``K8sTrainerPod``): a wrong type is an
    error naming its key, and the launcher reads back what the recipe set."""
    from resources.trainer import TrainerLauncher

    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text("deployment: {trainer: {launcher: k8s, k8s: {image: i, gpus: two}}}\n")
    with pytest.raises(ValueError, match=r"deployment\.trainer\.k8s\.gpus must be an integer, got 'two'"):
        load_settings(recipe)
    recipe.write_text(
        "deployment: {trainer: {launcher: k8s, k8s: {image: i, command: torchrun, gpus: 2, env_secrets: [s3]}}}\n"
    )
    pod = TrainerLauncher.from_deployment(load_settings(recipe).deployment.trainer).pod
    assert (pod.image, pod.command, pod.gpus, pod.env_secrets, pod.namespace) == (
        "i",
        "torchrun",
        2,
        ("s3",),
        "default",
    )


def test_missing_required_keys_say_what_they_are():
    with pytest.raises(
        ValueError,
        match=r"t: teachers\[0\] \(a\): missing required key\(s\) \['budget_usd'\] \(budget_usd: lifetime budget",
    ):
        settings.from_dict(
            TeachersConfig,
            {
                "ceiling_usd": 1.0,
                "teachers": [
                    {
                        "name": "a",
                        "base_url": "http://x/v1",
                        "model": "m",
                        "api_key_env": None,
                        "input_usd_per_mtok": 0,
                        "output_usd_per_mtok": 0,
                        "max_concurrency": 1,
                    }
                ],
            },
            "t",
        )


def test_a_rule_of_the_class_says_where_it_failed():
    with pytest.raises(
        ValueError, match=r"^pairs recipe: signature: text_similarity_threshold must be in \(0, 1\], got 0.0$"
    ):
        PairRecipe.from_dict({"signature": {"text_similarity_threshold": 0}})


def test_renamed_channel_weights_load_under_their_old_names(tmp_path):
    """``weights.alpha`` / ``weights.beta`` (before issue 36) load as ``weights.sdpo`` / ``weights.dpo``, with a
    warning naming the new keys: the same recipe as the new names; both names at once is an error."""
    import yaml

    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(yaml.safe_dump({"weights": {"grpo": 0.5, "alpha": 0.25, "beta": 2.0}, "dpo": {"beta": 0.3}}))
    new.write_text(yaml.safe_dump({"weights": {"grpo": 0.5, "sdpo": 0.25, "dpo": 2.0}, "dpo": {"beta": 0.3}}))
    with pytest.warns(settings.RenamedKeyWarning) as caught:
        from_old = TrainRecipe.load(old)
    assert sorted(str(w.message) for w in caught) == [
        f"{old}: weights.alpha is now weights.sdpo (the old name still loads; rename it)",
        f"{old}: weights.beta is now weights.dpo (the old name still loads; rename it)",
    ]
    assert from_old == TrainRecipe.load(new)
    assert (from_old.weights.sdpo, from_old.weights.dpo, from_old.dpo.beta) == (0.25, 2.0, 0.3)
    with pytest.raises(ValueError, match=r"weights.beta is the old name of weights.dpo; give only weights.dpo"):
        TrainRecipe.from_dict({"weights": {"beta": 1.0, "dpo": 1.0}})


def test_moved_keys_name_their_new_home():
    with pytest.raises(ValueError, match=r"'trace_root' now lives in recipes/pipeline.yaml"):
        IngestRecipe.from_dict({"trace_root": "~/.claude/projects"})


def test_check_thresholds_are_one_set_in_the_file_and_the_resource(tmp_path):
    """The ``checks`` of pipeline.yaml reach the ``recipes`` resource by name: the resource has every
    threshold of :class:`CheckThresholds` with the same default, and a value set in the file arrives."""
    import dataclasses

    from resources.recipes import CheckThresholds, PipelineRecipes

    fields = PipelineRecipes.model_fields
    for f in dataclasses.fields(CheckThresholds):
        assert f.name in fields and fields[f.name].default == f.default, f.name
    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text("checks: {max_quarantine_rows: 7, max_eval_regression: 0.5}\n")
    res = PipelineRecipes.from_settings(load_settings(recipe))
    assert (res.max_quarantine_rows, res.max_eval_regression, res.min_parse_success_ratio) == (7, 0.5, 0.95)


if __name__ == "__main__":
    DOC.write_text(generate() + "\n")
    print(f"wrote {DOC}")
