"""Pins of the Dagster internals the Parquet IO manager (resources/storage.py) calls.

``ParquetUPathIOManager.load_input`` reads every partition of a partitioned upstream through two
private methods of ``dg.UPathIOManager`` (the way the base class's own ``load_partitions`` does). A
Dagster upgrade can rename them or change their parameters; each check fails naming the method and
what changed. After reading the new Dagster code, update ``load_input`` and these pins together.
Checked on the installed Dagster, from its source (no instance is built).
"""

import ast
import inspect
import textwrap

import dagster as dg

# the version the pins were read from (pyproject.toml pins it too)
DAGSTER_VERSION = "1.13.27"
# private method -> its parameters, in order (load_input passes them positionally)
SIGNATURES = {
    "_get_paths_for_partitions": ["self", "context"],
    "_load_partition_from_path": ["self", "context", "partition_key", "path", "backcompat_path"],
}


def test_dagster_version_is_the_pinned_one():
    assert dg.__version__ == DAGSTER_VERSION, (
        f"Dagster {dg.__version__} installed, resources/storage.py's load_input was written against {DAGSTER_VERSION}: "
        "re-read UPathIOManager's private methods, fix load_input, then update the pins in this file"
    )


def test_private_methods_keep_their_signatures():
    for name, want in SIGNATURES.items():
        assert name in vars(dg.UPathIOManager), f"UPathIOManager no longer defines {name}"
        params = list(inspect.signature(getattr(dg.UPathIOManager, name)).parameters)
        assert params == want, (
            f"UPathIOManager.{name} parameters changed: Dagster has {params}, load_input passes {want}"
        )
    get_paths = inspect.signature(dg.UPathIOManager._get_paths_for_partitions)
    assert "dict[str" in str(get_paths.return_annotation), (
        f"_get_paths_for_partitions now returns {get_paths.return_annotation}; load_input indexes it by partition key"
    )


def test_base_class_still_loads_partitions_through_them():
    """``load_partitions`` is the base class's own reader of many partitions: while it calls both, the
    pair means what load_input uses it for."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(dg.UPathIOManager.load_partitions)))
    called = {
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
    }
    assert set(SIGNATURES) <= called, (
        f"UPathIOManager.load_partitions no longer calls {sorted(set(SIGNATURES) - called)}"
    )


def test_the_io_manager_calls_only_the_pinned_private_methods():
    from resources.storage import ParquetUPathIOManager

    src = inspect.getsource(ParquetUPathIOManager)
    private = {
        n.func.attr
        for n in ast.walk(ast.parse(textwrap.dedent(src)))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr.startswith("_")
        and not n.func.attr.startswith("__")
    }
    assert private == set(SIGNATURES), f"ParquetUPathIOManager calls private {sorted(private)}; pin each here"
