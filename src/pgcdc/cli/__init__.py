"""The ``pgcdc`` command (``pgcdc.cli.main``) and its subcommands, one module each."""

import os

# numpy (pyarrow imports it) starts OpenBLAS's threads at import, and they spin a while before
# they sleep: CPU taken from the receiver, which never calls BLAS. With one thread OpenBLAS
# starts none. Set before anything imports numpy; a value the user set is kept. The command's
# child processes (the pipeline's receiver, Spark's) inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
