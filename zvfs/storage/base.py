"""The key-value interface every store kind implements.

A store is a flat namespace of immutable byte strings addressed by `/`-separated keys
(tensorstore's kvstore idea): formats see only keys and byte ranges, never paths or URLs, so
the same shard logic runs over local disk, HTTP, S3 and GCS.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a store "directory" (a key prefix ending at the next `/`)."""

    name: str
    is_dir: bool
    size: int | None  # None when the listing does not say (HTTP index pages)


class Store(abc.ABC):
    """Async reads of byte ranges of keys. Every method is safe to call from trio tasks."""

    #: What the user named (path or URL with credentials removed); used in messages.
    display: str

    @abc.abstractmethod
    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None) -> bytes | None:
        """Bytes `[start, start+length)` of `key` (to the end when `length` is None).

        A negative `start` asks for the last `-start` bytes (one suffix request on HTTP).
        Returns None when the key does not exist; a range past the end comes back short,
        and callers that know the length they expect must check it. `extent` is a hint: the
        caller will soon want the bytes up to that offset too (remote stores fetch them now).
        """

    @abc.abstractmethod
    async def size(self, key: str) -> int | None:
        """Length of `key` in bytes, or None if it does not exist."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> list[Entry] | None:
        """Entries directly below `prefix` ("" is the root), or None if it is not a directory."""

    async def aclose(self) -> None:
        """Release descriptors and clients."""
