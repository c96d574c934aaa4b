"""Fixtures for the scale-out switches: the shipped cluster recipe, and variants of it in tmp files."""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "recipes" / "cluster.yaml"


@pytest.fixture(scope="session")
def cluster_defs():
    """``build_defs`` over recipes/cluster.yaml (k8s executor, k8s trainer pod, S3 store, Ray normalize)."""
    from assets.definitions import build_defs
    from assets.settings import load_settings

    settings = load_settings(CLUSTER)
    return settings, build_defs(settings)


@pytest.fixture
def cluster_variant(tmp_path):
    """Write recipes/cluster.yaml with ``deployment`` changed by ``edit(dep)``; returns its path."""

    def make(edit) -> Path:
        raw = yaml.safe_load(CLUSTER.read_text())
        edit(raw["deployment"])
        raw["recipes"] = {k: str(REPO / v) for k, v in raw["recipes"].items()}
        out = tmp_path / "pipeline.yaml"
        out.write_text(yaml.safe_dump(raw, sort_keys=False))
        return out

    return make
