"""Which build of the receiver's per-message path runs: mypyc's, or its source.

``setup.py`` compiles ``COMPILED_MODULES`` with mypyc from the same source, so the source stays the
only reference and a build without them is the same program, only slower. The source runs
instead of the build when ``PGCDC_PURE_PYTHON`` is set, and in a source checkout (an editable
install) when a module changed after its build: compiled members of the group call each other
directly, so the whole group then runs from source, with a warning to rebuild.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Every message the receiver handles passes through these, in the direction data flows.
COMPILED_MODULES = (
    "pgcdc.connection.protocol",
    "pgcdc.connection.replication",
    "pgcdc.decoding.pgoutput",
    "pgcdc.transactions.assembler",
    "pgcdc.transactions.session",
    "pgcdc.changelog.codec",
    "pgcdc.changelog.writer",
    "pgcdc.receiver",
)
PURE_PYTHON_ENV = "PGCDC_PURE_PYTHON"

_PACKAGE = Path(__file__).resolve().parent
_EXTENSION = importlib.machinery.EXTENSION_SUFFIXES[0]


def _paths(module: str) -> tuple[Path, Path]:
    """The module's source file and its compiled build's file."""
    base = _PACKAGE.parent.joinpath(*module.split("."))
    return base.with_suffix(".py"), base.with_name(base.name + _EXTENSION)


def is_stale(source: Path, built: Path) -> bool:
    """Whether, in a source checkout, ``source`` is newer than its build ``built``. An installed
    package is never checked: its files are written in no particular order."""
    if not (_PACKAGE.parent.parent / "setup.py").exists():
        return False
    return built.exists() and source.exists() and source.stat().st_mtime > built.stat().st_mtime


def stale_modules() -> list[str]:
    """Modules of a source checkout whose source is newer than their build."""
    return [module for module in COMPILED_MODULES if is_stale(*_paths(module))]


def compiled() -> bool:
    """Whether this process runs the compiled build."""
    from pgcdc import receiver

    return not str(receiver.__file__).endswith(".py")


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' source files, ahead of the default finders (which prefer an
    extension module over the source beside it)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        source, _ = _paths(fullname)
        return importlib.util.spec_from_file_location(fullname, source)


def choose_build() -> None:
    """Run the source instead of the build when asked to, or when the build is stale."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        use_source = True
    else:
        stale = stale_modules()
        use_source = bool(stale)
        if stale:
            warnings.warn(
                f"pgcdc: {', '.join(stale)} changed after the compiled build; running the "
                "source (slower). Rebuild with `pip install -e .` (or scripts/setup).",
                RuntimeWarning,
                stacklevel=2,
            )
    if use_source and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def c_extension(name: str) -> ModuleType | None:
    """The hand-written C extension ``name`` (``pgcdc._x`` built from ``_x.c`` beside it), or
    None where its Python reference must run instead: not built (no C compiler at install),
    ``PGCDC_PURE_PYTHON`` set, or (in a source checkout) its C source changed after its build."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    source = _PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".c")
    if is_stale(source, Path(module.__file__ or "")):
        warnings.warn(
            f"pgcdc: {source.name} changed after its build; running its Python reference "
            "(slower). Rebuild with `pip install -e .` (or scripts/setup).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return module
