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
    mode: int | None = None  # permission bits where the store has them (local), else None
    mtime: float | None = None  # seconds since the epoch where the listing says, else None


@dataclass(frozen=True, slots=True)
class Version:
    """One state of a key's bytes: what a shard index read from it is valid for.

    `tag` identifies the state: locally (st_dev, st_ino, st_mtime_ns, st_ctime_ns) of the file
    that was read, remotely the ETag (or Last-Modified when there is none). Two versions with
    equal `size` and `tag` hold the same bytes; anything else means the key was rewritten,
    replaced or truncated, and byte ranges taken from an index of the old version must not be
    read from the new one (the consistency model in docs/reliability.md)."""

    size: int
    tag: tuple
    mtime: float | None = None  # seconds since the epoch (st_mtime of chunk files), None if unknown
    mode: int | None = None  # permission bits (local files), None if unknown

    def same(self, other: "Version | None") -> bool:
        return other is not None and self.size == other.size and self.tag == other.tag


class Store(abc.ABC):
    """Async reads of byte ranges of keys. Every method is safe to call from trio tasks."""

    #: What the user named (path or URL with credentials removed); used in messages.
    display: str

    @abc.abstractmethod
    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        """Bytes `[start, start+length)` of `key` (to the end when `length` is None).

        A negative `start` asks for the last `-start` bytes (one suffix request on HTTP).
        Returns None when the key does not exist; a range past the end comes back short,
        and callers that know the length they expect must check it. `extent` is a hint: the
        caller will soon want the bytes up to that offset too (remote stores fetch them now).

        With `expect`, the bytes must come from that version of the key: if the key now holds
        other bytes (rewritten, replaced, truncated, deleted), raise `ShardChanged` instead of
        returning them. Locally an open descriptor of the expected file still counts (an atomic
        replace leaves the old file readable through it).
        """

    def read_now(self, key: str, start: int, length: int, expect: Version | None = None) -> "bytes | memoryview | None":
        """What `read` would return for this exact range, if it is at hand without waiting
        (locally: an open shard whose pages are cached), else None; raises like `read`. The
        result may be a view of a buffer that the store's next read overwrites: only for
        callers that are done with it before they next await (the FUSE reply, which pyfuse3
        copies out at once: no copy of the chunk in Python)."""
        return None

    def still_at(self, key: str, version: Version) -> bool:
        """Whether `key` is still at `version`, if that can be told without waiting (locally:
        the stat of an open descriptor); False when it cannot."""
        return False

    @abc.abstractmethod
    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        """Like `read` (exact range, no read-ahead), plus the version the bytes were read from
        (None with the bytes when the key does not exist). Shard indexes are read with this, so
        that every byte range taken from an index is tied to the version it describes."""

    @abc.abstractmethod
    async def current(self, key: str) -> Version | None:
        """The key's version as cheaply known now: locally a fresh `stat` of the path (a
        replaced file shows its new identity); remotely the version the last response for
        this key carried (no request), or None when nothing was read yet. Called when a chunk
        file is opened, to notice a changed shard before reading it."""

    @abc.abstractmethod
    async def size(self, key: str) -> int | None:
        """Length of `key` in bytes, or None if it does not exist."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> list[Entry] | None:
        """Entries directly below `prefix` ("" is the root), or None if it is not a directory."""

    async def aclose(self) -> None:
        """Release descriptors and clients."""
