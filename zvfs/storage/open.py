"""Turn what the user typed (a path or an fsspec URL) into a Store."""

from __future__ import annotations

import os

from ..errors import MetadataError
from .base import Store
from .local import LocalStore
from .remote import FsspecStore


def open_store(source: str, max_requests: int = 16, storage_options: dict | None = None) -> Store:
    if "://" not in source or source.startswith("file://"):
        path = source[len("file://"):] if source.startswith("file://") else source
        if not os.path.exists(path):
            raise MetadataError(source, "no such file or directory")
        if not os.path.isdir(path):
            raise MetadataError(source, "not a directory")
        return LocalStore(path)
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(source, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise MetadataError(source, f"cannot open: {e}") from e
    return FsspecStore(fs, root, display=source.split("?", 1)[0], max_requests=max_requests)
