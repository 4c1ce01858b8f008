"""Turn what the user typed (a path or an fsspec URL) into a Store."""

from __future__ import annotations

import os

from ..errors import MetadataError
from .base import Store
from .local import LocalStore
from .urls import redact


def open_store(source: str, max_requests: int = 16, storage_options: dict | None = None,
               readahead: int = 1 << 20, block_cache: int = 64 << 20, deadline: float = 30.0,
               follow_symlinks: bool = False, request_timeout: float = 20.0) -> Store:
    """A local path gets the pread fast path; a URL goes through fsspec, with retries inside
    `deadline` seconds, `request_timeout` seconds per attempt, and read-ahead that follows the
    access pattern (windows up to `readahead` bytes, 0 to disable) over a `block_cache`-byte
    cache."""
    if "://" not in source or source.startswith("file://"):
        path = source.removeprefix("file://")
        if not os.path.exists(path):
            raise MetadataError(source, "no such file or directory")
        if not os.path.isdir(path):
            raise MetadataError(source, "not a directory")
        return LocalStore(path, follow_symlinks=follow_symlinks)
    import fsspec  # (and the remote stores: fsspec, stamina and asyncio cost local mounts 60 ms at start)

    from .readahead import CoalescingStore
    from .remote import FsspecStore

    try:
        fs, root = fsspec.core.url_to_fs(source, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise MetadataError(redact(source), f"cannot open: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    store = FsspecStore(fs, root, display=redact(source), max_requests=max_requests, deadline=deadline,
                        request_timeout=request_timeout)
    return CoalescingStore(store, window=readahead, cache_bytes=block_cache) if readahead else store
