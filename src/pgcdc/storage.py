"""Where the change log and the lake live, and how to reach object storage.

Paths are local directories or URIs (``s3://bucket/prefix``). The settings to reach S3 (or an
S3-compatible server) come from ``[paths] storage_options`` in the pipeline's TOML file,
named as delta-rs and Rust's ``object_store`` name them (``aws_endpoint_url``,
``aws_secret_access_key``, ...), and otherwise from the environment (``AWS_*``), which
pyarrow, delta-rs and obstore read themselves. The same options reach every place that
touches storage: the change log's writer and readers (pyarrow), its writer lease (obstore),
the Spark source's executors, and the Delta sinks (delta-rs).

Secret values never appear in a ``repr``, a message or a log line: ``StorageOptions`` prints
them as ``********``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from pgcdc.errors import InvalidOption

__all__ = [
    "SECRET_KEYS",
    "StorageOptions",
    "filesystem",
    "is_s3",
]

# The canonical (delta-rs / object_store) S3 keys pgcdc accepts, and the names they also go by.
_S3_KEYS: dict[str, tuple[str, ...]] = {
    "aws_access_key_id": ("access_key_id",),
    "aws_secret_access_key": ("secret_access_key",),
    "aws_session_token": ("session_token", "aws_token", "token"),
    "aws_region": ("region",),
    "aws_endpoint_url": ("aws_endpoint", "endpoint", "endpoint_url"),
    "aws_allow_http": ("allow_http",),
    "aws_virtual_hosted_style_request": ("virtual_hosted_style_request",),
    # Read by delta-rs only (how it commits to S3); passed to the Delta sinks as they are.
    "aws_s3_allow_unsafe_rename": (),
    "aws_s3_locking_provider": (),
    "delta_dynamo_table_name": (),
    "aws_conditional_put": ("conditional_put",),
    "aws_copy_if_not_exists": ("copy_if_not_exists",),
}
_DELTA_ONLY = frozenset(
    (
        "aws_s3_allow_unsafe_rename",
        "aws_s3_locking_provider",
        "delta_dynamo_table_name",
        "aws_conditional_put",
        "aws_copy_if_not_exists",
    )
)
_CANONICAL = {alias: key for key, aliases in _S3_KEYS.items() for alias in (key, *aliases)}
SECRET_KEYS = frozenset(("aws_secret_access_key", "aws_session_token"))
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def is_s3(root: str) -> bool:
    return root.startswith("s3://")


@dataclass(frozen=True)
class StorageOptions:
    """Validated object storage settings (canonical keys); secrets redacted from ``repr``.

    Picklable, so the receiver process and Spark's executors get the same settings."""

    values: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(
        cls, given: Mapping[str, Any] | None, where: str = "storage_options"
    ) -> StorageOptions:
        """Check the keys (case-insensitive, ``AWS_`` forms too) and values; InvalidOption
        naming the closest known key for an unknown one. Secrets never enter a message."""
        values: dict[str, str] = {}
        for raw, given_value in (given or {}).items():
            name = str(raw).strip().lower()
            key = _CANONICAL.get(name)
            if key is None:
                close = difflib.get_close_matches(name, list(_CANONICAL), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise InvalidOption(
                    f"{where}: unknown key {raw!r}; {hint}known S3 keys (delta-rs and "
                    f"object_store names): {', '.join(_S3_KEYS)}"
                )
            if key in values:
                raise InvalidOption(f"{where}: {key} is given twice (as {raw!r} too)")
            value = given_value
            if isinstance(value, bool):
                value = "true" if value else "false"
            if not isinstance(value, str | int):
                shown = "a secret" if key in SECRET_KEYS else repr(value)
                raise InvalidOption(f"{where}: {key} must be a string, not {shown}")
            values[key] = str(value)
        options = cls(values)
        options._check(where)
        return options

    def _check(self, where: str) -> None:
        for key in ("aws_allow_http", "aws_virtual_hosted_style_request"):
            if key in self.values and self.values[key].lower() not in (*_TRUE, *_FALSE):
                raise InvalidOption(f"{where}: {key} = {self.values[key]!r}: use true or false")
        endpoint = self.values.get("aws_endpoint_url")
        if endpoint is not None:
            if not endpoint.startswith(("http://", "https://")):
                raise InvalidOption(
                    f"{where}: aws_endpoint_url = {endpoint!r}: give a URL with its scheme, "
                    "such as https://s3.example.com or http://127.0.0.1:9000"
                )
            if endpoint.startswith("http://") and not self.allow_http:
                raise InvalidOption(
                    f"{where}: aws_endpoint_url = {endpoint!r} is plain HTTP, which delta-rs "
                    "refuses unless aws_allow_http = true; set it (credentials then travel "
                    "unencrypted: only on a trusted network) or use https://"
                )
        if ("aws_access_key_id" in self.values) != ("aws_secret_access_key" in self.values):
            raise InvalidOption(
                f"{where}: give aws_access_key_id and aws_secret_access_key together (or "
                "neither, to take both from the environment or the instance's role)"
            )

    @property
    def allow_http(self) -> bool:
        return self.values.get("aws_allow_http", "false").lower() in _TRUE

    def __bool__(self) -> bool:
        return bool(self.values)

    def __repr__(self) -> str:
        shown = {k: "********" if k in SECRET_KEYS else v for k, v in self.values.items()}
        return f"StorageOptions({shown})"

    def delta(self) -> dict[str, str] | None:
        """For delta-rs (``storage_options``): every key, or None (the environment's)."""
        return dict(self.values) or None

    def object_store(self) -> tuple[dict[str, str], dict[str, Any]]:
        """For obstore's ``S3Store``: (config, client_options)."""
        config = {
            k: v for k, v in self.values.items() if k not in _DELTA_ONLY and k != "aws_allow_http"
        }
        if "aws_endpoint_url" in config:
            config["aws_endpoint"] = config.pop("aws_endpoint_url")
        client = {"allow_http": True} if self.allow_http else {}
        return config, client

    def pyarrow_s3(self) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem with these settings (the environment fills the rest)."""
        v = self.values
        kwargs: dict[str, Any] = {}
        if "aws_access_key_id" in v:
            kwargs["access_key"] = v["aws_access_key_id"]
            kwargs["secret_key"] = v["aws_secret_access_key"]
        if "aws_session_token" in v:
            kwargs["session_token"] = v["aws_session_token"]
        region = v.get("aws_region") or os.environ.get("AWS_REGION")
        if region:
            kwargs["region"] = region
        if "aws_endpoint_url" in v:
            kwargs["endpoint_override"] = v["aws_endpoint_url"]
        if v.get("aws_virtual_hosted_style_request", "false").lower() in _TRUE:
            kwargs["force_virtual_addressing"] = True
        return pafs.S3FileSystem(**kwargs)

    def spark_options(self) -> dict[str, str]:
        """As options of the ``pgcdc`` Spark source (``storage.<key>``): names with
        ``secret``/``token`` in them are what Spark redacts (``spark.redaction.regex``)."""
        return {f"storage.{k}": v for k, v in self.values.items()}

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str]) -> StorageOptions:
        given = {k[len("storage.") :]: v for k, v in options.items() if k.startswith("storage.")}
        return cls.parse(given, "the pgcdc source's storage.* options")


def filesystem(root: str, options: StorageOptions | None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and path of a URI, with ``options`` applied (``s3://`` only)."""
    if options and is_s3(root):
        return options.pyarrow_s3(), root[len("s3://") :]
    if options:
        raise InvalidOption(
            f"storage_options are for s3:// paths; {root!r} is not one (remove them, or give "
            "the path as s3://bucket/prefix)"
        )
    fs, path = pafs.FileSystem.from_uri(root)
    return fs, str(path)
