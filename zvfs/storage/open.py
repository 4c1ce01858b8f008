"""Turn what the user typed (a path or an fsspec URL) into a Store."""

from __future__ import annotations

import hashlib
import logging
import os

from ..errors import MetadataError
from .base import Store
from .cache import CoalescingCache
from .local import LocalStore
from .urls import redact
from .zipstore import ZipStore, zip_headed, zip_named


def open_store(source: str, max_requests: int = 16, storage_options: dict | None = None,
               readahead: int = 1 << 20, block_cache: int = 64 << 20, deadline: float = 30.0,
               follow_symlinks: bool = False, request_timeout: float = 20.0, max_directory: int = 64 << 20,
               max_listing: int | None = None,
               inflated: CoalescingCache | None = None, cache_dir: str | None = None,
               cache_size: int | None = None) -> Store:
    """A local path gets the pread fast path; a URL goes through fsspec, with retries inside
    `deadline` seconds, `request_timeout` seconds per attempt, and read-ahead that follows the
    access pattern (windows up to `readahead` bytes, 0 to disable) over a `block_cache`-byte
    cache, and with `cache_dir` over a persistent disk cache of `cache_size` bytes (diskcache.py;
    local stores have none: they are on disk already). A local file, or a URL named `.zip` or
    `.ozx`, is a zip archive (zipstore.py: its central directory held within `max_directory`
    bytes, deflated entries kept in `inflated`); the listings under way are held within
    `max_listing` bytes together."""
    if "://" not in source or source.startswith("file://"):
        path = source.removeprefix("file://")
        if not os.path.exists(path):
            raise MetadataError(source, "no such file or directory")
        if os.path.isfile(path):
            real = os.path.realpath(path)
            return ZipStore(LocalStore(os.path.dirname(real)), os.path.basename(real), path, max_directory, inflated)
        if not os.path.isdir(path):
            raise MetadataError(source, "not a directory")
        return LocalStore(path, follow_symlinks=follow_symlinks, max_listing=max_listing)
    import fsspec  # (and the remote stores: fsspec, stamina and asyncio cost local mounts 60 ms at start)

    from .remote import FsspecStore

    try:
        if source.split("://", 1)[0] in ("gs", "gcs"):
            # gcsfs's JSON-API class itself: `gcsfs.GCSFileSystem` (what fsspec's registry
            # gives) is an experimental layer unless GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT was false
            # when gcsfs was first imported, and its bucket-layout probe goes to Google over gRPC
            # whatever the endpoint: measured, a listing of a loopback emulator through the
            # fsspec front, in a process that had imported gcsfs first, timed out after 20 s
            # (a `zvfs ls`: 41 s). zvfs reads GCS through the JSON API (`FsspecStore._gcs_get`).
            from gcsfs.core import GCSFileSystem

            fs, root = GCSFileSystem(**(storage_options or {})), GCSFileSystem._strip_protocol(source)
        else:
            fs, root = fsspec.core.url_to_fs(source, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise MetadataError(redact(source), f"cannot open: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    store: Store = FsspecStore(fs, root, display=redact(source), max_requests=max_requests, deadline=deadline,
                               request_timeout=request_timeout, max_listing=max_listing)
    if cache_dir:
        import sqlite3

        from .diskcache import DEFAULT_SIZE, DiskCache, DiskCachedStore, damaged

        try:
            cache = DiskCache(cache_dir, DEFAULT_SIZE if cache_size is None else cache_size)
        except (OSError, sqlite3.Error) as e:
            if not damaged(e):  # (a directory that cannot be made or written: the user's to fix)
                raise MetadataError(f"cache_dir={cache_dir}", f"cannot use it: {e}") from None
            logging.getLogger("zvfs.storage").warning("disk cache %s unusable (%s): reading without it; 'zvfs cache %s "
                                                      "--clear' starts it anew", cache_dir, e, cache_dir)
        else:
            # the full URL (its query string selects the object too), hashed: no credential is stored
            endpoint = (storage_options or {}).get("endpoint_url") or ""
            store = DiskCachedStore(store, cache, identity=hashlib.sha256(f"{source}\0{endpoint}".encode()).hexdigest(),
                                    settle=source.split("://", 1)[0] in ("http", "https"))
    return _upper_layers(store, zip_named(source), max_directory, inflated, readahead, block_cache)


def _upper_layers(store: Store, archive: bool, max_directory: int, inflated: CoalescingCache | None,
                  readahead: int, block_cache: int) -> Store:
    """What `open_store` lays over a remote store (or its disk cache): the zip archive it holds
    where `archive`, then read-ahead (above the archive: its streams and blocks are the entries')."""
    from .readahead import CoalescingStore

    if archive:
        store = ZipStore(store, "", store.display, max_directory, inflated)
    return CoalescingStore(store, window=readahead, cache_bytes=block_cache) if readahead else store


async def open_zip(store: Store, max_directory: int, inflated: CoalescingCache | None = None) -> Store | None:
    """`store`, as `open_store` made it, read as the zip archive its root object is, where it is
    one: a URL of an archive not named so, with the layers `open_store` gives one. None for
    local stores and archives already open (`open_store` opens local files as archives)."""
    from .readahead import CoalescingStore

    ahead = store if isinstance(store, CoalescingStore) else None
    below = ahead.inner if ahead is not None else store
    if isinstance(below, (ZipStore, LocalStore)) or not await zip_headed(below):
        return None
    return _upper_layers(below, True, max_directory, inflated, ahead.window if ahead else 0,
                         ahead.cache_bytes if ahead else 0)
