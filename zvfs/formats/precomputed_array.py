"""Neuroglancer precomputed volume scales as arrays, for the Zarr v3, Zarr v2 and N5 views.

Each volume scale is one `ArrayModel` under its `key`, with the axes and index order of
tensorstore's `neuroglancer_precomputed` driver: (x, y, z, channel). A raw precomputed chunk
is Fortran-ordered little-endian (x fastest, channel slowest), which is a Zarr v3 chunk with
codecs `transpose [3, 2, 1, 0]` + `bytes little`: so a chunk stored raw (raw encoding, and raw
shard data encoding or no sharding) passes through as stored. Edge chunks are stored cropped
to the volume (`cropped_edges`); the views pad them (Zarr) or keep them (N5).

Everything else gets one decode step, whose output is the raw chunk, cropped to the volume:
gzip (`data_encoding: gzip` in shards, `<name>.gz` files of unsharded scales),
compressed_segmentation (the `compressed-segmentation` package), jpeg and png (imagecodecs,
decoding into an array of the chunk's shape). Every step is bounded by
the chunk's shape: a stored chunk longer than its shape allows, a gzip stream that decodes
past the chunk's size, a result of the wrong size, or a compressed_segmentation chunk whose
offsets point outside it, is a CorruptShardError (EIO for that chunk file). The
compressed_segmentation decoder trusts every offset in its input (a lying header crashes the
process, measured), so each chunk's channel offsets, block headers, encoded values and the
table entries those values select are checked against its length first (numpy; values are
unpacked only for blocks whose table could run past the end; measured 0.3-1.2 ms against
0.6-10 ms of decoding for uint64 chunks of 64**3 to 256x256x32).

Sharded scales are read through `ShardedKV` (chunk id = compressed Morton code of the grid
cell); unsharded scales are files `<x0>-<x1>_<y0>-<y1>_<z0>-<z1>` in the scale directory.

Attributes: `resolution` and `voxel_offset` as in the info file (x, y, z), plus the N5 viewer
conventions per scale (`pixelResolution` {unit nm, dimensions: resolution} and
`downsamplingFactors`: resolution / scale 0's resolution), both for the three spatial axes
only: n5-viewer and BigDataViewer build a 3-D transform from them and define no channel
entry, and the spatial axes are the first three N5 axes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable

import compressed_segmentation
import imagecodecs
import numpy as np

from ..errors import CorruptShardError
from ..storage.base import Store, Version
from ..storage.cache import CoalescingCache
from ..storage.gather import gather
from .array import ArrayModel, GroupModel, Hierarchy
from .chunkref import ChunkRef
from .precomputed import INFO, Dataset, ShardedKV, VolumeScale, gunzip, morton_bits, morton_decode, morton_encode, parse_scales, volume_chunk_limit

log = logging.getLogger("zvfs.precomputed_array")

DIMENSION_NAMES = ("x", "y", "z", "channel")
#: the stored raw chunk (x fastest, channel slowest) as a Zarr v3 codec chain over (x, y, z, c)
RAW_CODECS = [{"name": "transpose", "configuration": {"order": [3, 2, 1, 0]}},
              {"name": "bytes", "configuration": {"endian": "little"}}]
DATA_TYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32", "float64")
DECODED_ENCODINGS = ("raw", "compressed_segmentation", "jpeg", "png")
#: image encodings: decoder, the data types and channel counts the format has
IMAGES = {"jpeg": (imagecodecs.jpeg8_decode, ("uint8",), (1, 3)), "png": (imagecodecs.png_decode, ("uint8", "uint16"), (1, 2, 3, 4))}


# --------------------------------------------------------------------------- the hierarchy


def no_array_form(dataset: Dataset) -> dict[str, str]:
    """The dataset's directories that no array view shows, and why (`zvfs inspect` lists them);
    "" for the whole dataset when it holds no volume."""
    if dataset.kind != "volume":
        return {"": "annotations have no array form"}
    info = dataset.info
    out = {}
    for member, what in (("mesh", "meshes"), ("skeletons", "skeletons"), ("segment_properties", "segment properties")):
        if isinstance(info.get(member), str) and info[member].strip("/"):
            out[info[member].strip("/")] = f"{what} have no array form"
    return out


def volume_hierarchy(store: Store, dataset: Dataset, cache: CoalescingCache, decoded: CoalescingCache) -> Hierarchy:
    """The root group and one array per volume scale (an annotation dataset has no arrays;
    skeletons and meshes have no array form and are left out).

    `cache` holds shard indexes and chunk tables; `decoded` is the views' cache of decoded
    chunks, consulted only to warn when one decoded chunk would not fit in it."""
    version = dataset.versions.get(INFO)
    root = GroupModel("", version=version, meta_key=INFO)
    out: Hierarchy = {"": root}
    if dataset.kind != "volume":
        return out
    info = dataset.info
    scales = parse_scales(info, f"{store.display}/{INFO}")
    first = _resolution(info["scales"][0])
    for scale, meta in zip(scales, info["scales"]):
        if scale.key in out:
            continue  # a repeated key names one directory: the first scale holds it
        array = scale_array(store, info, scale, meta, first, cache, version)
        if array.warning is None and array.chunks.decodes:  # type: ignore[attr-defined]
            nbytes = math.prod(array.chunk_shape) * np.dtype(array.data_type).itemsize
            if nbytes > decoded.max_bytes:
                log.warning("%s: a decoded chunk (%d bytes) is larger than the decoded-chunk cache (%d bytes): "
                            "every read of one decodes it again", scale.key, nbytes, decoded.max_bytes)
        out[scale.key] = array
        root.children.append(scale.key)
    return out


def _resolution(meta: dict) -> list:
    res = meta.get("resolution")
    ok = isinstance(res, list) and len(res) == 3 and all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in res)
    return list(res) if ok else [1, 1, 1]


def _factor(r: float, r0: float) -> float | int:
    f = r / r0
    return int(f) if float(f).is_integer() else f


def scale_array(store: Store, info: dict, scale: VolumeScale, meta: dict, first_resolution: list, cache: CoalescingCache,
                version: Version | None) -> ArrayModel:
    """The ArrayModel of one volume scale (`meta`: its entry in the info file)."""
    data_type = info.get("data_type")
    channels = info.get("num_channels", 1)
    encoding = meta.get("encoding", "raw")
    block = meta.get("compressed_segmentation_block_size")
    warning = None
    if data_type not in DATA_TYPES:
        warning, data_type = f"data_type {data_type!r} has no Zarr equivalent", "uint8"
    if not isinstance(channels, int) or isinstance(channels, bool) or not 1 <= channels <= 2**16:
        warning, channels = f"num_channels {channels!r} is not a positive integer", 1
    if encoding not in DECODED_ENCODINGS:
        warning = f"encoding {encoding!r} is not decoded here"
    elif encoding == "compressed_segmentation":
        if data_type not in ("uint32", "uint64"):
            warning = f"compressed_segmentation of {data_type} (only uint32 and uint64 exist)"
        elif not (isinstance(block, list) and len(block) == 3 and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 2**12 for b in block)):
            warning = f"compressed_segmentation_block_size {block!r} is not 3 positive integers"
    elif encoding in IMAGES and (data_type not in IMAGES[encoding][1] or channels not in IMAGES[encoding][2]):
        warning = f"{encoding} chunks of {channels} x {data_type} do not exist"
    resolution = _resolution(meta)
    chunks = VolumeChunks(store, scale, np.dtype(data_type).newbyteorder("<"), channels, encoding,
                          tuple(block) if encoding == "compressed_segmentation" and warning is None else None, cache)
    attributes = {
        "resolution": resolution,
        "voxel_offset": list(scale.voxel_offset),
        "pixelResolution": {"unit": "nm", "dimensions": resolution},
        "downsamplingFactors": [_factor(r, r0) for r, r0 in zip(resolution, first_resolution)],
    }
    return ArrayModel(path=scale.key, shape=(*scale.size, channels), data_type=data_type,
                      chunk_shape=(*scale.chunk_size, channels), codecs=RAW_CODECS, fill_value=0, chunks=chunks,
                      dimension_names=DIMENSION_NAMES, attributes=attributes, cropped_edges=True, separator="/",
                      version=version, meta_key=INFO, warning=warning)


# --------------------------------------------------------------------------- chunks of one scale


@dataclass(frozen=True, slots=True)
class VolumeTable:
    """Stored chunks of one shard (or of an unsharded scale): grid coordinates (m, 4, C-sorted,
    channel 0), where their bytes are, and whether they are gzip-encoded. `ref(i)` attaches
    the chunk's decode step."""

    source: "VolumeChunks"
    coords: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    gzip: np.ndarray  # bool per row
    key: str | None = None  # one key for every row (a shard) ...
    keys: list[str] | None = None  # ... or one per row (unsharded files)
    version: Version | None = None

    @property
    def nbytes(self) -> int:
        return self.coords.nbytes + self.offsets.nbytes + self.lengths.nbytes + self.gzip.nbytes + 64 * len(self.keys or ())

    def ref(self, i: int) -> ChunkRef:
        key = self.key if self.keys is None else self.keys[i]
        return self.source.ref(tuple(self.coords[i, :3].tolist()), key, self.offsets.item(i), self.lengths.item(i),  # type: ignore[arg-type]
                               bool(self.gzip[i]), self.version)


class VolumeChunks:
    """The ChunkSource of one volume scale: grid (gx, gy, gz, 1), chunk by grid position, and
    the stored chunks for listings."""

    def __init__(self, store: Store, scale: VolumeScale, dtype: np.dtype, channels: int, encoding: str,
                 block_size: tuple[int, int, int] | None, cache: CoalescingCache):
        self.store = store
        self.scale = scale
        self.dtype = dtype
        self.channels = channels
        self.encoding = encoding
        self.block_size = block_size
        self.cache = cache
        self.grid = (*scale.grid, 1)
        self.ndim = 4
        self.bits = morton_bits(scale.grid)
        #: most bytes a stored (encoded) or decoded chunk of this scale may hold
        self.limit = volume_chunk_limit(scale.chunk_size, channels, str(dtype))
        self.kv = ShardedKV(store, scale.key, scale.sharding, cache, self.limit) if scale.sharding else None
        self.shard_gzip = bool(scale.sharding and scale.sharding.data_encoding == "gzip")

    @property
    def decodes(self) -> bool:
        """Whether chunks get a decode step (else every well-formed chunk passes through)."""
        return self.encoding != "raw" or self.shard_gzip

    def in_grid(self, coords: tuple[int, ...]) -> bool:
        return len(coords) == 4 and coords[3] == 0 and all(0 <= c < g for c, g in zip(coords, self.grid))

    def extent(self, cell: tuple[int, int, int]) -> tuple[int, int, int]:
        return tuple(min(c, s - i * c) for c, s, i in zip(self.scale.chunk_size, self.scale.size, cell))  # type: ignore[return-value]

    async def locate(self, coords: tuple[int, ...]) -> ChunkRef | None:
        if not self.in_grid(coords):
            return None
        cell = tuple(coords[:3])
        if self.kv is not None:
            ref = await self.kv.locate(morton_encode(cell, self.bits))
            if ref is None:
                return None
            return self.ref(cell, ref.key, ref.offset, ref.length, self.shard_gzip, ref.version, ref.evidence)  # type: ignore[arg-type]
        name = f"{self.scale.key}/{self.scale.chunk_name(cell)}"
        for key, gz in ((name, False), (name + ".gz", True)):
            size = await self.store.size(key)
            if size is not None:
                return self.ref(cell, key, 0, size, gz, None)  # type: ignore[arg-type]
        return None

    def ref(self, cell: tuple[int, int, int], key: str, offset: int, length: int, gz: bool, version: Version | None,
            evidence: tuple | None = None) -> ChunkRef:
        """Where chunk `cell` is, with the step that turns its stored bytes into the raw chunk
        cropped to the volume (None when they already are)."""
        extent = self.extent(cell)
        expected = math.prod(extent) * self.channels * self.dtype.itemsize
        if self.encoding == "raw" and not gz:
            if length == expected:
                return ChunkRef(key, offset, length, version=version, evidence=evidence)
            return _failing(key, offset, version, f"raw chunk {list(cell)} is {length} bytes, expected {expected}")
        if length > self.limit:
            return _failing(key, offset, version, f"chunk {list(cell)} of {length} bytes is larger than any encoding of its shape")
        return ChunkRef(key, offset, length, self._decoder(key, extent, expected, gz), version, evidence)

    def _decoder(self, key: str, extent: tuple[int, int, int], expected: int, gz: bool) -> Callable[[bytes], bytes]:
        limit = expected if self.encoding == "raw" else self.limit
        unzip = (lambda data: gunzip(data, "chunk data", key, limit)) if gz else bytes
        if self.encoding == "raw":
            return lambda data: _exact(unzip(data), expected, key)
        if self.encoding in IMAGES:
            encoding, dtype, channels = self.encoding, self.dtype, self.channels
            return lambda data: decode_image(unzip(data), encoding, extent, channels, dtype, key)
        block, dtype, channels = self.block_size, self.dtype, self.channels
        return lambda data: decode_compressed_segmentation(unzip(data), extent, channels, dtype, block, key)  # type: ignore[arg-type]

    # -- listings

    async def tables(self, fixed: dict[int, int]) -> list[VolumeTable]:
        """Tables of the stored chunks: one per shard (each checked against the shard's current
        version, cached per version), or one for an unsharded scale's files. Rows are not
        filtered by `fixed`: any shard can hold any cell under a hash."""
        if self.kv is None:
            return [await self.cache.get(("pcfiles", self.scale.key), self._file_table)]
        found = await gather(lambda shard=shard: self._current_table(shard) for shard in await self.kv.shards())
        return [t for t in found if t is not None]

    async def _current_table(self, shard: int) -> VolumeTable | None:
        si = await self.kv.current_index(shard)  # type: ignore[union-attr]
        if si is None:
            return None
        tag = None if si.version is None else si.version.tag
        return await self.cache.get(("pctable", self.scale.key, shard, tag), lambda: self._shard_table(shard))

    async def _shard_table(self, shard: int) -> VolumeTable:
        si, entries = await self.kv.shard_entries(shard) or (None, None)  # type: ignore[union-attr]
        if si is None:
            return self._table(np.zeros((0, 3), np.int64), None, None, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        ids = entries.ids
        keep = ids < np.uint64(1 << sum(self.bits))
        cells = morton_decode(ids[keep], self.bits)
        inside = np.all(cells < np.array(self.scale.grid, dtype=np.int64), axis=1)
        return self._table(cells[inside], si.key, si.version, entries.starts[keep][inside], entries.sizes[keep][inside],
                           np.full(int(inside.sum()), self.shard_gzip))

    async def _file_table(self) -> VolumeTable:
        found: dict[tuple[int, ...], tuple[str, bool, int | None]] = {}
        for e in await self.store.list(self.scale.key) or []:
            if e.is_dir:
                continue
            gz = e.name.endswith(".gz")
            cell = self.scale.parse_chunk_name(e.name[:-3] if gz else e.name)
            if cell is not None and (cell not in found or found[cell][1]):  # a plain file wins over `.gz`
                found[cell] = (f"{self.scale.key}/{e.name}", gz, e.size)
        cells = sorted(found)
        sizes = [found[c][2] if found[c][2] is not None else await self.store.size(found[c][0]) or 0 for c in cells]
        return self._table(np.array(cells, np.int64).reshape(len(cells), 3), None, None, np.zeros(len(cells), np.uint64),
                           np.array(sizes, np.uint64), np.array([found[c][1] for c in cells], bool), [found[c][0] for c in cells])

    def _table(self, cells: np.ndarray, key: str | None, version: Version | None, offsets: np.ndarray, lengths: np.ndarray,
               gz: np.ndarray | None = None, keys: list[str] | None = None) -> VolumeTable:
        """A table of grid cells (m, 3), rows put in C order of the (x, y, z, 0) coordinates."""
        coords = np.concatenate([cells, np.zeros((len(cells), 1), np.int64)], axis=1)
        order = np.lexsort(coords.T[::-1]) if len(coords) else np.zeros(0, np.int64)
        gz = np.zeros(len(cells), bool) if gz is None else gz
        return VolumeTable(self, coords[order], offsets[order], lengths[order], gz[order], key=key,
                           keys=None if keys is None else [keys[i] for i in order.tolist()], version=version)


def _failing(key: str, offset: int, version: Version | None, message: str) -> ChunkRef:
    """A chunk that exists but cannot be read: no bytes are fetched, its decode raises."""

    def fail(_: bytes) -> bytes:
        err = CorruptShardError(key, message)
        log.warning("%s", err)
        raise err

    return ChunkRef(key, offset, 0, decode=fail, version=version)


def _exact(data: bytes, expected: int, key: str) -> bytes:
    if len(data) != expected:
        raise CorruptShardError(key, f"chunk decodes to {len(data)} bytes, expected {expected}")
    return data


# --------------------------------------------------------------------------- compressed_segmentation


#: encoded bits per value the decoder handles (32 also exists in the format, but the
#: package's decoder computes its mask as `(1 << 32) - 1` in int arithmetic, which is 0 on
#: x86: it would return wrong labels, so such chunks are refused)
CSEG_BITS = (0, 1, 2, 4, 8, 16)
#: values unpacked at once while checking (bounds the checker's own temporary memory)
CSEG_BATCH = 1 << 20


def check_compressed_segmentation(data: bytes, extent: tuple[int, int, int], channels: int, itemsize: int,
                                  block_size: tuple[int, int, int], key: str) -> None:
    """Raise CorruptShardError unless every word the decoder will read lies inside `data`:
    the channel offsets, each channel's block headers, each block's encoded values, and the
    lookup table entries those values select (only the values of voxels inside the chunk
    are read)."""

    def bad(message: str):
        err = CorruptShardError(key, f"compressed_segmentation chunk: {message}")
        log.warning("%s", err)
        raise err

    if len(data) % 4:
        bad(f"{len(data)} bytes is not a whole number of 32-bit words")
    words = np.frombuffer(data, dtype="<u4")
    n = len(words)
    if n < channels:
        bad("shorter than its channel offsets")
    entry = itemsize // 4
    bgrid = [-(-e // b) for e, b in zip(extent, block_size)]
    nblocks = math.prod(bgrid)
    per_block = math.prod(block_size)
    k = np.arange(per_block)
    vx, vy, vz = k % block_size[0], (k // block_size[0]) % block_size[1], k // (block_size[0] * block_size[1])
    b = np.arange(nblocks)
    # voxels of each block inside the chunk, per axis
    inside = [np.minimum(block_size[0], extent[0] - (b % bgrid[0]) * block_size[0]),
              np.minimum(block_size[1], extent[1] - (b // bgrid[0] % bgrid[1]) * block_size[1]),
              np.minimum(block_size[2], extent[2] - (b // (bgrid[0] * bgrid[1])) * block_size[2])]
    for c in range(channels):
        o = int(words[c])
        if o < channels or o + 2 * nblocks > n:
            bad(f"channel {c} starts at word {o}, outside the chunk's {n} words")
        head = words[o : o + 2 * nblocks].reshape(nblocks, 2)
        table = (head[:, 0] & 0xFFFFFF).astype(np.int64) + o
        bits = (head[:, 0] >> 24).astype(np.int64)
        values = head[:, 1].astype(np.int64) + o
        if not np.isin(bits, CSEG_BITS).all():
            bad(f"encoded bits {sorted(set(bits.tolist()) - set(CSEG_BITS))} (supported: {list(CSEG_BITS)})")
        if np.any((bits > 0) & (values + (per_block * bits + 31) // 32 > n)):
            bad("encoded values run past the end")
        top = (1 << bits) - 1  # the largest table index a block can read ...
        suspect = table + (top + 1) * entry > n
        top[suspect] = 0  # ... or, where that runs past the end, the largest it does read
        for nb in CSEG_BITS[1:]:
            sel = np.flatnonzero(suspect & (bits == nb))
            nwords = (per_block * nb + 31) // 32
            shifts = (np.arange(32 // nb) * nb).astype(np.uint32)
            step = max(1, CSEG_BATCH // per_block)
            for at in range(0, len(sel), step):
                idx = sel[at : at + step]
                w = words[values[idx][:, None] + np.arange(nwords)]
                v = ((w[:, :, None] >> shifts) & np.uint32((1 << nb) - 1)).reshape(len(idx), -1)[:, :per_block]
                read = (vx < inside[0][idx, None]) & (vy < inside[1][idx, None]) & (vz < inside[2][idx, None])
                top[idx] = np.where(read, v, 0).max(axis=1)
        if np.any(table + (top + 1) * entry > n):
            bad("a lookup table runs past the end")


def decode_compressed_segmentation(data: bytes, extent: tuple[int, int, int], channels: int, dtype: np.dtype,
                                   block_size: tuple[int, int, int], key: str) -> bytes:
    """The raw chunk (Fortran order, little-endian) of a compressed_segmentation chunk."""
    check_compressed_segmentation(data, extent, channels, dtype.itemsize, block_size, key)
    out = compressed_segmentation.decompress(bytes(data), (*extent, channels), dtype.newbyteorder("="), block_size, order="F")
    return out.astype(dtype, copy=False).tobytes(order="F")


# --------------------------------------------------------------------------- jpeg, png


def decode_image(data: bytes, encoding: str, extent: tuple[int, int, int], channels: int, dtype: np.dtype, key: str) -> bytes:
    """The raw chunk of a jpeg or png chunk: one image `x` wide and `y * z` high (rows in z,
    y order), channels interleaved. The decoder writes into an array of exactly that shape
    and type, refusing any other image before decoding (imagecodecs checks `out` against
    the header): a lying header cannot make it allocate."""
    ex, ey, ez = extent
    out = np.empty((ey * ez, ex, channels), dtype=dtype.newbyteorder("="))
    try:
        image = IMAGES[encoding][0](data, out=out)
    except Exception as e:  # the codecs' own error types (and ValueError for another shape)
        err = CorruptShardError(key, f"{encoding} chunk: {e}")
        log.warning("%s", err)
        raise err from None
    return image.reshape(ez, ey, ex, channels).transpose(3, 0, 1, 2).astype(dtype, copy=False).tobytes()
