"""Local-disk store: pread on the trio thread, no worker-thread hop.

A thread hop per read measured ~2x slower than a plain pread for 4-64 KiB reads on this kind
of machine, and a pread from the page cache does not block long enough to stall the loop.
File descriptors of shards are kept open in a small LRU because shards are read many times.
"""

from __future__ import annotations

import errno
import os
from collections import OrderedDict

import trio

from ..errors import StorageError
from .base import Entry, Store


class LocalStore(Store):
    def __init__(self, root: str, max_open_files: int = 256, follow_symlinks: bool = False):
        self.root = os.path.abspath(root)
        self.display = self.root
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._max_open = max_open_files

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key) if key else self.root

    def _fd(self, key: str) -> int | None:
        fd = self._fds.get(key)
        if fd is not None:
            self._fds.move_to_end(key)
            return fd
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None
        except NotADirectoryError:
            return None
        except OSError as e:
            raise StorageError(f"{self._path(key)}: {e.strerror}") from e
        self._fds[key] = fd
        if len(self._fds) > self._max_open:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None) -> bytes | None:
        fd = self._fd(key)
        if fd is None:
            return None
        try:
            if start < 0 or length is None:
                size = os.fstat(fd).st_size
                if start < 0:
                    start = max(0, size + start)
                    length = size - start
                else:
                    length = max(0, size - start)
            return os.pread(fd, length, start)
        except OSError as e:
            if e.errno == errno.EISDIR:
                return None
            raise StorageError(f"{self._path(key)}: {e.strerror}") from e

    async def size(self, key: str) -> int | None:
        fd = self._fd(key)
        return None if fd is None else os.fstat(fd).st_size

    async def list(self, prefix: str) -> list[Entry] | None:
        return await trio.to_thread.run_sync(self._list_sync, prefix)

    def _list_sync(self, prefix: str) -> list[Entry] | None:
        try:
            with os.scandir(self._path(prefix)) as it:
                out = []
                for de in it:
                    try:
                        st = de.stat()
                    except OSError:
                        continue
                    is_dir = de.is_dir()
                    out.append(Entry(de.name, is_dir, 0 if is_dir else st.st_size))
                return out
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"{self._path(prefix)}: {e.strerror}") from e

    async def aclose(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
