"""Settings for a process that runs only pgcdc: the ``pgcdc`` command and the pipeline's
receiver process (never applied to a process that imports pgcdc as a library)."""

from __future__ import annotations

import gc
from collections.abc import MutableMapping


def quiet_blas(environ: MutableMapping[str, str]) -> None:
    """One OpenBLAS thread, unless the user chose: numpy (pyarrow imports it) starts OpenBLAS's
    threads at import, and they spin a while before they sleep, taking CPU from the receiver,
    which never calls BLAS; with one thread OpenBLAS starts none. Takes effect in a process
    whose environment has it before numpy is imported."""
    environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def freeze_imports() -> None:
    """Once the imports are done: what they made lives as long as the process, so the collector
    need not walk it again in every full collection, nor at exit (about a tenth of a second of
    a short command). Cyclic garbage made before is never freed, hence only in such processes."""
    gc.freeze()
