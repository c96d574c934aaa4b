"""Build of the compiled ingest path (everything else about the package is in pyproject.toml).

``composer_pipeline/ingest/csrc`` holds a C++17 CPython extension, ``composer_pipeline.ingest._native``,
the fast twin of the Python ingest code (see composer_pipeline/ingest/native.py). It is optional:
where it cannot be compiled the install still succeeds and ingest runs the Python path.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

CSRC = Path("composer_pipeline/ingest/csrc")


def source_hash() -> str:
    """sha256 over the C++ sources; compiled in, so native.py can refuse a build older than its source."""
    h = hashlib.sha256()
    for p in sorted(CSRC.iterdir()):
        if p.suffix in (".h", ".cpp"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()

setup(
    ext_modules=[
        Extension(
            "composer_pipeline.ingest._native",
            sources=[str(CSRC / "module.cpp")],
            depends=[str(p) for p in sorted(CSRC.glob("*.h"))],
            language="c++",
            define_macros=[("COMPOSER_NATIVE_SOURCE_HASH", f'"{source_hash()}"')],
            extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
