"""Any fsspec filesystem (HTTP, S3, GCS, memory, ...) as a store.

fsspec's blocking API is called from worker threads under one `trio.CapacityLimiter`, so a
slow backend never stalls the FUSE loop and the number of requests in flight stays bounded.

Transient faults (5xx, throttling, connection resets, timeouts) are retried with exponential
backoff until `deadline` seconds have passed since the first attempt; then, like any other
backend error, they become one `StorageError` (EIO for that file; the mount stays up and serves
again once the backend recovers). A missing key is not a fault: it is None.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, TypeVar
from urllib.parse import unquote

import trio

from ..errors import StorageError
from .base import Entry, Store

log = logging.getLogger("zvfs.storage")

T = TypeVar("T")
MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
#: S3 error codes that mean "slow down and try again"
THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
              "RequestTimeout", "InternalError", "ServiceUnavailable"}


def _status(e: BaseException) -> int | None:
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(e, "response", None)  # botocore ClientError
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def transient(e: BaseException) -> bool:
    """Worth retrying: server errors, throttling, and faults of the connection itself."""
    response = getattr(e, "response", None)
    if isinstance(response, dict) and response.get("Error", {}).get("Code") in THROTTLING:
        return True
    status = _status(e)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(e, (TimeoutError, ConnectionError)):
        return True
    name = type(e).__name__
    return any(word in name for word in ("Timeout", "Connection", "Disconnected", "Payload", "EndpointConnection"))


class FsspecStore(Store):
    def __init__(self, fs, root: str, display: str, max_requests: int = 16, deadline: float = 30.0):
        self.fs = fs
        self.root = root.rstrip("/")
        self.display = display
        self.deadline = deadline
        self._limiter = trio.CapacityLimiter(max_requests)
        #: async backends (HTTP, S3, GCS) run their coroutines on fsspec's own event loop
        #: thread: submit to it directly instead of through a worker thread (one hop, not two)
        self._loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    async def _run(self, key: str, sync: Callable[[], T], coro: Callable[[], object]) -> T:
        """One backend call under the concurrency limit, with retries inside the deadline."""
        async with self._limiter:
            if self._loop is None:
                return await trio.to_thread.run_sync(self._call, key, sync)
            give_up = trio.current_time() + self.deadline
            delay = 0.05
            while True:
                try:
                    return await _on_loop(self._loop, coro)
                except MISSING:
                    raise
                except Exception as e:  # noqa: BLE001
                    if not transient(e) or trio.current_time() + delay > give_up:
                        raise _storage_error(self.display, key, e) from e
                    log.debug("%s/%s: %s, retrying in %.2f s", self.display, key, type(e).__name__, delay)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 2.0)

    def _call(self, key: str, fn: Callable[[], T]) -> T:
        """fn() with retries of transient faults inside the deadline (in a worker thread)."""
        give_up = time.monotonic() + self.deadline
        delay = 0.05
        while True:
            try:
                return fn()
            except MISSING:
                raise
            except Exception as e:  # noqa: BLE001 - every backend has its own exception types
                if not transient(e) or time.monotonic() + delay > give_up:
                    raise _storage_error(self.display, key, e) from e
                log.debug("%s/%s: %s, retrying in %.2f s", self.display, key, type(e).__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None) -> bytes | None:
        end = None if (length is None or start < 0) else start + length
        path = self._path(key)
        try:
            return await self._run(key, lambda: self.fs.cat_file(path, start=start, end=end),
                                   lambda: self.fs._cat_file(path, start=start, end=end))
        except MISSING:
            return None

    async def size(self, key: str) -> int | None:
        path = self._path(key)
        try:
            return int(await self._run(key, lambda: self.fs.size(path), lambda: self.fs._size(path)))
        except MISSING:
            return None

    async def list(self, prefix: str) -> list[Entry] | None:
        path = self._path(prefix)
        try:
            infos = await self._run(prefix, lambda: self.fs.ls(path, detail=True), lambda: self.fs._ls(path, detail=True))
        except MISSING:
            return None
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


async def _on_loop(loop, coro: Callable[[], object]):
    """Await a coroutine on another thread's asyncio loop from trio, without a worker thread:
    the future's done-callback wakes this task."""
    future = asyncio.run_coroutine_threadsafe(coro(), loop)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()


def _protocols(fs) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _storage_error(display: str, key: str, e: Exception) -> StorageError:
    """One line naming the key and what the backend said (HTTP status, connection error...)."""
    status = _status(e)
    what = f"HTTP {status}" if status is not None else type(e).__name__
    detail = str(e).splitlines()[0] if str(e) else ""
    return StorageError(f"{display}/{key}: {what}{': ' + detail if detail and str(status) not in detail[:4] else ''}"[:300])
