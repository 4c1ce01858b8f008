"""Chunk files of the array views (Zarr v3 of a non-Zarr kind, Zarr v2, N5): the stored
chunk's bytes where they already are the view's chunk, otherwise the chunk transcoded once
and kept in the decoded cache.

What a view writes for one array is an `Encoding`: the order of the values in its bytes (a
permutation of the model's axes, then C order), their byte order, at most one compressor, an
optional header (N5 blocks), and whether chunks at the array's upper end hold the full chunk
(Zarr) or only the part inside the array (N5 may do either: a block that passes through keeps
the stored extent). A chunk passes through when the model's bytes are already in that form
(`passthrough`) and its stored extent is the view's; a ref's own `decode` step (gzip or
compressed_segmentation precomputed chunks) runs first in every case. Otherwise the chunk is
decoded with the model's codecs at its stored extent, cropped or padded with the fill value,
and encoded in the view's form.

Sizes: a chunk passed through has the ref's length (plus the header); a transcoded chunk
written without compression has its size from its extent; only compressed output and
decode-only chunks with a compressor need the bytes first (the kernel asks for those sizes
before any stat or read, see tree.py).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Awaitable, Callable, Hashable

import numpy as np

from ..errors import CorruptShardError
from ..formats.array import ArrayModel
from ..formats.chunkref import ChunkRef
from ..formats.codecs import (
    COMPRESSORS,
    Chain,
    DecodeError,
    compressor,
    decode_step,
    fill_value,
    name_of,
)
from ..storage.base import Pin, Store
from ..storage.cache import CoalescingCache
from ..tree.handles import BytesHandle, Handle, RangeHandle, read_ref
from ..tree.nodes import File, RangeFile
from .hierarchy import NotExpressible

log = logging.getLogger("zvfs.view")

FILL_KEY = ""  # ChunkRef.key of a chunk that is not stored (a fill block)


@dataclass(frozen=True)
class Encoding:
    """How one view writes the chunks of one array (see the module docstring)."""

    view: str
    model: ArrayModel
    chain: Chain  # the model's codecs, parsed
    perm: tuple[int, ...]  # model axes in the order the view's bytes list them (C order)
    dtype: np.dtype  # the values' type with the view's byte order
    codec: dict | None  # bytes->bytes codec of the view's chunks
    passthrough: bool  # the model's chunk bytes (after the ref's decode) already are the view's
    full_edges: bool  # the view's edge chunks hold the full chunk (Zarr), else the part inside
    header: Callable[[tuple[int, ...]], bytes] | None = None  # from a chunk's extent (model order)

    @property
    def sized(self) -> bool:
        """Chunks that do not pass through are the header and the bare values: their size
        follows from their extent."""
        return self.codec is None and self.dtype.kind != "O" and (not self.passthrough or simple(self.chain))

    def stored_extent(self, coords: tuple[int, ...]) -> tuple[int, ...]:
        return self.model.chunk_extent(coords) if self.model.cropped_edges else self.model.chunk_shape

    def extent(self, coords: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the view's chunk `coords`."""
        if self.full_edges:
            return self.model.chunk_shape
        return self.stored_extent(coords) if self.passthrough else self.model.chunk_extent(coords)

    def prefix(self, extent: tuple[int, ...]) -> bytes:
        return b"" if self.header is None else self.header(extent)

    def direct(self, ref: ChunkRef, coords: tuple[int, ...]) -> bool:
        """The view's chunk is the stored byte range (behind the header)."""
        return (self.passthrough and ref.decode is None and ref.key != FILL_KEY
                and self.stored_extent(coords) == self.extent(coords))

    def known_size(self, ref: ChunkRef, coords: tuple[int, ...]) -> int | None:
        extent = self.extent(coords)
        if self.direct(ref, coords):
            return len(self.prefix(extent)) + ref.length
        if self.sized:
            return len(self.prefix(extent)) + math.prod(extent) * self.dtype.itemsize
        return None

    def fill(self) -> np.ndarray:
        return np.array(fill_value(self.model.data_type, self.model.fill_value if self.model.fill_value is not None else 0),
                        dtype=self.dtype)

    def encode(self, arr: np.ndarray) -> bytes:
        data = np.ascontiguousarray(arr.transpose(self.perm), dtype=self.dtype).tobytes()
        return data if self.codec is None else bytes(compressor(self.codec).encode(data))

    def fit(self, arr: np.ndarray, extent: tuple[int, ...]) -> np.ndarray:
        """`arr` cropped or padded with the fill value to `extent`."""
        if arr.shape == extent:
            return arr
        out = np.empty(extent, dtype=self.dtype)
        out[...] = self.fill()
        inside = tuple(slice(0, min(a, e)) for a, e in zip(arr.shape, extent))
        out[inside] = arr[inside]
        return out

    def file(self, ino: int, store: Store, ref: ChunkRef, coords: tuple[int, ...], decoded: CoalescingCache) -> File:
        """The view's file for chunk `coords` (a plain range file where the bytes pass through
        without a header)."""
        if self.header is None and self.direct(ref, coords):
            return RangeFile(ino, store, ref)
        return ChunkFile(ino, store, ref, decoded, self, coords)


def simple(chain: Chain) -> bool:
    """The chain is values in some axis order, with at most one compressor: what `encode`
    writes (so edge chunks can be padded or cropped)."""
    return (chain.serializer == "bytes" and (not chain.array_codecs or chain.order is not None)
            and len(chain.compressors) <= 1 and all(name_of(c) in COMPRESSORS for c in chain.compressors))


def zarr_encoding(view: str, model: ArrayModel, chain: Chain) -> Encoding:
    """The Zarr views write the model's own chunk form, edge chunks padded to the full chunk."""
    if model.cropped_edges and not simple(chain):
        raise NotExpressible(f"edge chunks cannot be padded: codecs {[name_of(c) for c in model.codecs]}")
    perm = chain.order if chain.order is not None else tuple(range(model.ndim))
    codec = chain.compressors[0] if len(chain.compressors) == 1 else None
    return Encoding(view, model, chain, perm, chain.dtype(), codec, passthrough=True, full_edges=True)


class ChunkFile(RangeFile):
    """A chunk file of an array view: the header (if any) and the stored bytes, or the chunk
    built (decoded, transcoded, or filled) once per version and kept in the decoded cache."""

    __slots__ = ("encoding", "coords")

    def __init__(self, ino: int, store: Store, ref: ChunkRef, decoded: CoalescingCache, encoding: Encoding,
                 coords: tuple[int, ...]):
        super().__init__(ino, store, ref, decoded)
        self.encoding = encoding
        self.coords = coords

    def token(self) -> Hashable:
        return FILL_KEY if self.ref.key == FILL_KEY else self.ref.version

    def known_size(self) -> int | None:
        return self.encoding.known_size(self.ref, self.coords)

    async def size(self) -> int:
        size = self.known_size()
        return size if size is not None else len(await self.built(self.ref, lambda: read_ref(self.store, self.ref)))

    async def built(self, ref: ChunkRef, stored: Callable[[], Awaitable[bytes]]) -> bytes:
        """The file's bytes from the chunk `ref` names (`stored` reads it), once per version
        (not kept from a version that is not settled)."""
        enc = self.encoding

        async def build() -> bytes:
            if ref.key == FILL_KEY:
                return transcode(enc, ref, self.coords, None)
            return await decode_step(lambda raw: transcode(enc, ref, self.coords, raw), await stored())

        if ref.evidence is not None:
            return await build()
        tag = None if ref.version is None else ref.version.tag
        return await self.decoded.get((enc.view, enc.model.path, self.coords, ref.key, tag, ref.offset), build)  # type: ignore[union-attr]

    async def open(self) -> Handle:
        if self.ref.key == FILL_KEY:  # stored since?
            return await self.reopen()
        return await super().open()

    async def open_located(self, ref: ChunkRef) -> Handle:
        if ref.key == FILL_KEY:
            return BytesHandle(await self.built(ref, _nothing), FILL_KEY)
        return await super().open_located(ref)

    def handle(self, pin: Pin, ref: ChunkRef) -> Handle:
        return ChunkHandle(pin, ref, self)

    def bytes_at_hand(self) -> None:
        """Never the stored range (a header, a transcoded chunk): nothing to push ahead."""
        return None


async def _nothing() -> bytes:
    return b""


def transcode(enc: Encoding, ref: ChunkRef, coords: tuple[int, ...], raw: bytes | None) -> bytes:
    """A chunk file's bytes from the stored chunk (None: a chunk never written, all fill).
    Only CPU: a large chunk's runs in a worker thread (`decode_step`)."""
    extent = enc.extent(coords)
    if raw is None:
        return enc.prefix(extent) + enc.encode(np.broadcast_to(enc.fill(), extent))
    data = raw if ref.decode is None else ref.decode(raw)
    if enc.passthrough and enc.stored_extent(coords) == extent:
        return enc.prefix(extent) + data
    try:
        arr = enc.chain.decode(data, enc.model.data_type, enc.stored_extent(coords))
    except DecodeError as e:
        err = CorruptShardError(ref.key, f"chunk {list(coords)} of {enc.model.path or '/'}: {e}")
        log.warning("%s", err)
        raise err from None
    return enc.prefix(extent) + enc.encode(enc.fit(arr, extent))


class ChunkHandle(RangeHandle):
    """An open chunk file of an array view: behind the header the stored range as it is
    (`Encoding.direct`), or the file's built bytes."""

    __slots__ = ("file",)

    def __init__(self, pin: Pin, ref: ChunkRef, file: ChunkFile):
        super().__init__(pin, ref, file.decoded, file.encoding.known_size(ref, file.coords))
        self.file = file

    async def read(self, offset: int, size: int) -> bytes:
        enc, ref, coords = self.file.encoding, self.ref, self.file.coords
        if not enc.direct(ref, coords):
            return (await self.file.built(ref, lambda: self.stored(0, ref.length)))[offset:offset + size]
        header = enc.prefix(enc.extent(coords))
        out = header[offset:offset + size]
        if size > len(out):
            out += await RangeHandle.read(self, max(0, offset - len(header)), size - len(out))
        return out

    async def read_for_reply(self, offset: int, size: int) -> bytes:
        """Not the stored range as it is: no view of the store's buffer."""
        return await self.read(offset, size)
