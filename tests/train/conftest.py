from __future__ import annotations

import pytest

from tests.support.synthetic_train import write_store


@pytest.fixture(scope="session")
def synth_store(tmp_path_factory) -> str:
    return write_store(tmp_path_factory.mktemp("train-data"))
