"""Any fsspec filesystem (HTTP, S3, GCS, memory, ...) as a store.

fsspec's blocking API is called from worker threads under one `trio.CapacityLimiter`, so a
slow backend never stalls the FUSE loop and the number of requests in flight stays bounded.
"""

from __future__ import annotations

from urllib.parse import unquote

import trio

from ..errors import StorageError
from .base import Entry, Store


class FsspecStore(Store):
    def __init__(self, fs, root: str, display: str, max_requests: int = 16):
        self.fs = fs
        self.root = root.rstrip("/")
        self.display = display
        self._limiter = trio.CapacityLimiter(max_requests)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None) -> bytes | None:
        end = None if (length is None or start < 0) else start + length
        return await trio.to_thread.run_sync(self._read_sync, key, start, end, limiter=self._limiter)

    def _read_sync(self, key: str, start: int, end: int | None) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key), start=start, end=end)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except Exception as e:  # noqa: BLE001 - every backend has its own exception types
            raise _storage_error(self.display, key, e) from e

    async def size(self, key: str) -> int | None:
        return await trio.to_thread.run_sync(self._size_sync, key, limiter=self._limiter)

    def _size_sync(self, key: str) -> int | None:
        try:
            return int(self.fs.size(self._path(key)))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except Exception as e:  # noqa: BLE001
            raise _storage_error(self.display, key, e) from e

    async def list(self, prefix: str) -> list[Entry] | None:
        return await trio.to_thread.run_sync(self._list_sync, prefix, limiter=self._limiter)

    def _list_sync(self, prefix: str) -> list[Entry] | None:
        path = self._path(prefix)
        try:
            infos = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except Exception as e:  # noqa: BLE001
            raise _storage_error(self.display, prefix, e) from e
        if len(infos) == 1 and infos[0].get("type") == "file" and infos[0]["name"].rstrip("/") == path:
            return None  # a key, not a prefix
        out = []
        http = any(p in ("http", "https") for p in _protocols(self.fs))
        for info in infos:
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if http:  # index pages link to URL-quoted names ("1:0" -> "1%3A0")
                name = unquote(name)
            if not name or info["name"].rstrip("/") == path:
                continue
            is_dir = info.get("type") == "directory"
            size = info.get("size")
            out.append(Entry(name, is_dir, 0 if is_dir else (None if size is None else int(size))))
        return out


def _protocols(fs) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _storage_error(display: str, key: str, e: Exception) -> StorageError:
    """One line naming the key and what the backend said (HTTP status, connection error...)."""
    status = getattr(e, "status", None) or getattr(e, "code", None)
    what = f"HTTP {status}" if isinstance(status, int) else type(e).__name__
    detail = str(e).splitlines()[0] if str(e) else ""
    return StorageError(f"{display}/{key}: {what}{': ' + detail if detail and str(status) not in detail[:4] else ''}"[:300])
