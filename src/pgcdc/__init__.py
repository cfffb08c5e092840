"""pgcdc: change data capture from PostgreSQL logical decoding into lakehouse tables."""

from pgcdc.lsn import LSN

__all__ = ["LSN"]
__version__ = "0.1.0"
