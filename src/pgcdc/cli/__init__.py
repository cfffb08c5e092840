"""The ``pgcdc`` command (``pgcdc.cli.main``) and its subcommands, one module each."""

import os

from pgcdc.runtime import quiet_blas

# Before anything imports numpy; the command's child processes inherit it.
quiet_blas(os.environ)
