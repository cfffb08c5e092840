"""Settings for a process that runs only pgcdc: the ``pgcdc`` command and the pipeline's
receiver process (never applied to a process that imports pgcdc as a library)."""

from __future__ import annotations

import gc
from collections.abc import MutableMapping


def tune_environment(environ: MutableMapping[str, str]) -> None:
    """Settings of the libraries the receiver loads, unless the user chose; they take effect in
    a process whose environment has them before numpy and pyarrow are imported.

    - One OpenBLAS thread: numpy (pyarrow imports it) starts OpenBLAS's threads at import, and
      they spin a while before they sleep, taking CPU from the receiver, which never calls
      BLAS; with one thread OpenBLAS starts none.
    - Arrow's system allocator instead of its default (mimalloc on Linux): mimalloc faulted
      fresh pages in for the buffers of each frame the change log builds (in building its free
      lists), where glibc's malloc gives the next frame what the last one freed.
    """
    environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def freeze_imports() -> None:
    """Once the imports are done: what they made lives as long as the process, so the collector
    need not walk it again in every full collection, nor at exit (about a tenth of a second of
    a short command). Cyclic garbage made before is never freed, hence only in such processes."""
    gc.freeze()
