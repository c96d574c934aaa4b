"""The test command's pytest arguments (``composer_pipeline.bootstrap``): two xdist workers by default."""

from __future__ import annotations

import os

from composer_pipeline.bootstrap import pytest_workers


def test_two_workers_by_module_unless_the_arguments_choose():
    two = ["-n", "2", "--dist", "loadscope"] if (os.cpu_count() or 1) > 1 else []
    assert pytest_workers([]) == two
    assert pytest_workers(["tests/ui", "-x"]) == two
    for chosen in (["-n", "0"], ["-n0"], ["--numprocesses=4"], ["-p", "no:xdist"], ["--dist", "load"]):
        assert pytest_workers(chosen) == [], chosen
