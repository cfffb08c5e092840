"""The ``pgcdc`` command (``pgcdc.cli.main``) and its subcommands, one module each."""

import os

from pgcdc.runtime import tune_environment

# Before anything imports numpy; the command's child processes inherit it.
tune_environment(os.environ)
