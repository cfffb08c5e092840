"""pgcdc: change data capture from PostgreSQL logical decoding into lakehouse tables."""

from pgcdc import _native

# Before any compiled module is imported: the source may have to run instead (see _native).
_native.choose_build()

from pgcdc.lsn import LSN  # noqa: E402

__all__ = ["LSN"]
__version__ = "0.1.0"
