"""Build hook: the receiver's per-message path compiled with mypyc; the stream's reader, the
timestamp conversion and the event builder in C.

The modules in ``pgcdc._native.COMPILED_MODULES`` are plain, type-annotated Python; mypyc compiles
the same source into C extensions. The source stays the only reference (``pgcdc._native`` runs it
instead of a stale or unwanted build), so a build with ``PGCDC_PURE_PYTHON=1`` (no C compiler
needed) is the same program, only slower.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from setuptools import Extension, setup


def _compiled_modules() -> list[str]:
    """The list pgcdc._native keeps (parsed, not imported: pgcdc's dependencies may be absent)."""
    tree = ast.parse(Path("src/pgcdc/_native.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "COMPILED_MODULES":
            return list(ast.literal_eval(node.value))
    raise RuntimeError("src/pgcdc/_native.py has no COMPILED_MODULES")


def _extensions() -> list[object]:
    if os.environ.get("PGCDC_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    # mypy sees the sources and the build's own requirements: in an isolated build pgcdc's other
    # dependencies are not installed, and what it cannot see it takes as Any (slower there,
    # never wrong). numpy is a build requirement: the modules mypy follows into (the columnar
    # decoders) name numpy array types as aliases, which without numpy are not types at all and
    # fail the build (a fresh environment without numpy installed failed so).
    options = ["--config-file=", "--ignore-missing-imports", "--python-version=3.11"]
    sources = [f"src/{module.replace('.', '/')}.py" for module in _compiled_modules()]
    compiled = mypycify([*options, *sources], opt_level="3", group_name="pgcdc_native")
    # The replication stream's CopyData reader (pgcdc.connection.copyread says why).
    reader = Extension(
        "pgcdc.connection._copyread",
        ["src/pgcdc/connection/_copyread.c"],
        extra_compile_args=["-O2"],
    )
    # PostgreSQL timestamps as datetimes (pgcdc.pgtime says why) and events made from their
    # fields' values (pgcdc.events.builder).
    small = [
        Extension(f"pgcdc.{name}", [f"src/pgcdc/{name}.c"], extra_compile_args=["-O2"])
        for name in ("_pgtime", "_slotted")
    ]
    return [*compiled, reader, *small]


setup(ext_modules=_extensions())
