"""Open files: what a file of the tree gives when it is opened, a snapshot of its bytes.

The contract (docs/reliability.md): every byte read through a handle comes from the one
version of the file that its open saw; a read that finds that version gone raises
`ShardChanged` (EIO), never the bytes of another version. A handle holds its version through a
`Pin` (a local shard replaced by rename keeps serving its old bytes), and `token` names that
version for whoever caches the bytes (the FUSE front keeps the kernel's page cache to one
version per inode).

Chunks located in an index read from a version not yet settled (`Version.settled`) carry the
index bytes that located them (`ChunkRef.evidence`): every read checks them again after the
data (`Pin.verify`), and once the version shows settled the handle reads without the check.
No FUSE here: the FUSE front, `zvfs cat` and the other fronts read files through these.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Hashable

from ..errors import CorruptShardError, ShardChanged
from ..formats.chunkref import ChunkRef
from ..formats.codecs import decode_step
from ..storage.base import Pin, Store, Version, version_token
from ..storage.cache import CoalescingCache

log = logging.getLogger("zvfs.handles")


class Handle:
    """An open file. `token` identifies its bytes (equal tokens, equal bytes); `size` is their
    length when known without reading."""

    __slots__ = ("token", "size")

    def __init__(self, token: Hashable, size: int | None):
        self.token = token
        self.size = size

    async def read(self, offset: int, size: int) -> bytes:
        raise NotImplementedError

    async def read_for_reply(self, offset: int, size: int) -> bytes | memoryview:
        """`read`, for a caller done with the result before it next awaits (the FUSE reply):
        it may be a view of a store's buffer (`Pin.read_now`)."""
        return await self.read(offset, size)

    def release(self) -> None:
        """The file is closed."""


class BytesHandle(Handle):
    __slots__ = ("data",)

    def __init__(self, data: bytes, token: Hashable):
        super().__init__(token, len(data))
        self.data = data

    async def read(self, offset: int, size: int) -> bytes:
        return self.data[offset:offset + size]


def check_length(ref: ChunkRef, data: bytes | None, expected: int | None = None) -> bytes:
    """A chunk's bytes must be exactly as long as its index entry says: anything shorter is a
    truncated shard (EIO for its files, one log line), never short data."""
    expected = ref.length if expected is None else expected
    if data is None or len(data) != expected:
        got = "nothing" if data is None else f"{len(data)} bytes"
        err = CorruptShardError(ref.key, f"truncated: expected {expected} bytes at offset {ref.offset}, got {got}")
        log.warning("%s", err)
        raise err
    return data


async def read_ref(store: Store, ref: ChunkRef, decode: bool = False) -> bytes:
    """A chunk's stored bytes, of the version its ref names (not through an open file: checked
    like an open file's read); with `decode`, after the ref's decode step."""
    if ref.evidence is None:
        data = check_length(ref, await store.read(ref.key, ref.offset, ref.length, expect=ref.version))
    else:
        pin = await store.pin(ref.key, ref.version)
        if pin is None:
            raise ShardChanged(ref.key, "deleted while mounted")
        if not pinned_at(pin, ref.version):
            pin.release()
            raise ShardChanged(ref.key)
        try:
            data = await RangeHandle(pin, ref, None, ref.length).stored(0, ref.length)
        finally:
            pin.release()
    return await decode_step(ref.decode, data) if decode and ref.decode is not None else data


def pinned_at(pin: Pin, version: Version | None) -> bool:
    """`pin` holds `version` (a local store pins the file the path names now, which may be a
    later version than the one asked for: `Store.pin`)."""
    return version is None or pin.version is None or version.same(pin.version)


class RangeHandle(Handle):
    """An open chunk file: a byte range of a pinned store key, decoded if the ref says so (the
    decoded bytes kept in `decoded`, per version)."""

    __slots__ = ("pin", "ref", "decoded")

    def __init__(self, pin: Pin, ref: ChunkRef, decoded: CoalescingCache | None, size: int | None):
        super().__init__(ref.version if ref.version is not None else pin.version, size)
        self.pin = pin
        self.ref = ref
        self.decoded = decoded

    async def stored(self, offset: int, size: int) -> bytes:
        """Bytes of the stored range, as long as asked (within the range), checked."""
        ref = self.ref
        data = check_length(ref, await self.pin.read(ref.offset + offset, size, ref.offset + ref.length), size)
        if ref.evidence is not None:
            await self.verified()
        return data

    async def verified(self) -> None:
        """The index bytes that located the chunk are still there (after a read of it)."""
        ref = self.ref
        now = await self.pin.verify(ref.evidence)  # type: ignore[arg-type]
        if now is None:
            raise ShardChanged(ref.key, "changed while being read")
        if now.settled:  # no later change can keep the version now: reads need no check
            self.ref = dataclasses.replace(ref, version=now, evidence=None)

    async def decoded_bytes(self) -> bytes:
        """The ref's decode step applied to the stored bytes (once per version, kept)."""
        ref = self.ref

        async def load() -> bytes:
            return await decode_step(ref.decode, await self.stored(0, ref.length))  # type: ignore[arg-type]

        if ref.evidence is not None or self.decoded is None:
            return await load()
        tag = None if ref.version is None else ref.version.tag
        return await self.decoded.get((ref.key, tag, ref.offset), load)

    async def read(self, offset: int, size: int) -> bytes:
        ref = self.ref
        if ref.decode is not None:
            return (await self.decoded_bytes())[offset:offset + size]
        size = max(0, min(size, ref.length - offset))
        return await self.stored(offset, size) if size else b""

    async def read_for_reply(self, offset: int, size: int) -> bytes | memoryview:
        ref = self.ref
        n = min(size, ref.length - offset)
        if ref.decode is None and ref.evidence is None and n > 0:
            data = self.pin.read_now(ref.offset + offset, n)
            if data is not None:
                return data
        return await self.read(offset, size)

    def release(self) -> None:
        self.pin.release()


class PassHandle(Handle):
    """An open file shown as stored: the pinned key, all of it."""

    __slots__ = ("pin",)

    def __init__(self, pin: Pin):
        v = pin.version
        super().__init__(None if v is None else version_token(v), None if v is None else v.size)
        self.pin = pin

    async def read(self, offset: int, size: int) -> bytes:
        if self.size is not None:
            size = max(0, min(size, self.size - offset))
        if not size:
            return b""
        data = await self.pin.read(offset, size)
        if self.size is None and self.pin.version is not None:  # (remote: known from the first read)
            self.size = self.pin.version.size
        if data is None or len(data) != size and (self.size is None or offset + len(data) != self.size):
            raise CorruptShardError(self.pin.key, f"expected {size} bytes at offset {offset}, got {0 if data is None else len(data)}")
        return data

    def release(self) -> None:
        self.pin.release()
