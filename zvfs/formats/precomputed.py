"""Neuroglancer precomputed and its `neuroglancer_uint64_sharded_v1` sharding.

`ShardedKV` is the uint64-keyed key-value view over one sharded directory (tensorstore's
`neuroglancer_uint64_sharded` kvstore idea): chunk id -> hashed -> shard file and minishard
-> shard index (fixed size, at the start of the shard) -> minishard index (variable, maybe
gzip) -> byte range. Volume chunks are keyed by their compressed Morton code, skeletons and
meshes by segment id, annotations by id or spatial cell.

Shard indexes and minishard indexes are read with range requests and kept in the bounded,
coalescing cache. The obsolete `<shard>.index` + `<shard>.data` pair is read as the
concatenation it stands for.
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import mmh3
import numpy as np

from ..errors import CorruptShardError, MetadataError, ShardChanged, StorageError, TooManyOpen, first_time
from ..storage.base import Store, Version, proof
from ..storage.cache import LISTING_MAX_AGE, CoalescingCache, drop_if_changed
from ..storage.gather import gather
from .array import distinct
from .chunkref import ChunkRef
from .codecs import decode_step
from .jsonfile import MetadataTally, parse_json_object, read_metadata

log = logging.getLogger("zvfs.precomputed")

INFO = "info"
SHARDED_TYPE = "neuroglancer_uint64_sharded_v1"
#: decoded gzip output allowed per chunk when the metadata implies no size (skeletons, meshes,
#: annotations) and per minishard index, beyond which the data is treated as corrupt; volume
#: chunks get a bound from their shape instead (`volume_chunk_limit`). Kept well inside the
#: default memory budget (the decoded cache holds 40 MiB of the default 256M).
MAX_DECODED = 32 << 20
#: shard numbers probed (concurrently, under the store's request limit) when a directory cannot
#: be listed (HTTP without index pages); past this many the listing is empty, with one log line
MAX_PROBED_SHARDS = 1 << 16
#: bytes of a lazy shard index read at once when it is listed
LAZY_SLICE = 4 << 20


def gunzip(data: bytes, what: str, key: str, limit: int = MAX_DECODED) -> bytes:
    """Decode gzip with an output limit (a small bomb must not take the daemon's memory)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit)
        if d.unconsumed_tail:
            raise CorruptShardError(key, f"{what} decodes past {limit} bytes")
        out += d.flush()
    except zlib.error as e:
        raise CorruptShardError(key, f"{what} is not valid gzip ({e})") from None
    if not d.eof:
        raise CorruptShardError(key, f"{what} is truncated gzip")
    return out


def _gunzip_chunk(key: str, limit: int):
    return lambda raw: gunzip(raw, "chunk data", key, limit)


def volume_chunk_limit(chunk_size, num_channels: int, data_type: str) -> int:
    """Most bytes a volume chunk can decode to: its raw size (compressed_segmentation stays
    below twice that even with one label per voxel), plus room for headers."""
    try:
        itemsize = np.dtype(data_type).itemsize
    except TypeError:
        itemsize = 8
    return 2 * math.prod(chunk_size) * max(1, num_channels) * itemsize + (64 << 10)


# --------------------------------------------------------------------------- sharding spec


@dataclass(frozen=True)
class ShardingSpec:
    preshift_bits: int
    hash: str  # "identity" | "murmurhash3_x86_128"
    minishard_bits: int
    shard_bits: int
    minishard_index_encoding: str  # "raw" | "gzip"
    data_encoding: str  # "raw" | "gzip"

    @classmethod
    def parse(cls, spec: Any, where: str) -> "ShardingSpec":
        if not isinstance(spec, dict) or spec.get("@type") != SHARDED_TYPE:
            raise MetadataError(where, f"sharding @type must be {SHARDED_TYPE!r}")
        bits = {}
        for name in ("preshift_bits", "minishard_bits", "shard_bits"):
            v = spec.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 64:
                raise MetadataError(where, f"sharding {name} must be an integer in [0, 64], got {v!r}")
            bits[name] = v
        if bits["minishard_bits"] + bits["shard_bits"] > 64:
            raise MetadataError(where, "sharding minishard_bits + shard_bits exceeds 64")
        if bits["minishard_bits"] > 32:
            raise MetadataError(where, f"sharding minishard_bits {bits['minishard_bits']} is absurd (shard index of 2**{bits['minishard_bits']} entries)")
        h = spec.get("hash")
        if h not in ("identity", "murmurhash3_x86_128"):
            raise MetadataError(where, f"unknown sharding hash {h!r}")
        enc = {}
        for name in ("minishard_index_encoding", "data_encoding"):
            v = spec.get(name, "raw")
            if v not in ("raw", "gzip"):
                raise MetadataError(where, f"sharding {name} must be raw or gzip, got {v!r}")
            enc[name] = v
        return cls(bits["preshift_bits"], h, bits["minishard_bits"], bits["shard_bits"], **enc)

    def hash_id(self, chunk_id: int) -> int:
        x = chunk_id >> self.preshift_bits
        if self.hash == "identity":
            return x
        return mmh3.hash64(struct.pack("<Q", x), 0, False, False)[0]

    def locate(self, chunk_id: int) -> tuple[int, int]:
        """(shard, minishard) of a chunk id."""
        h = self.hash_id(chunk_id)
        return (h >> self.minishard_bits) & ((1 << self.shard_bits) - 1), h & ((1 << self.minishard_bits) - 1)

    @property
    def shard_index_nbytes(self) -> int:
        return 16 << self.minishard_bits

    def shard_name(self, shard: int) -> str:
        digits = max(1, math.ceil(self.shard_bits / 4))
        return f"{shard:0{digits}x}"

    def shard_of(self, name: str, suffixes: tuple[str, ...] = ("shard", "index", "data")) -> int | None:
        """The shard number a file name stands for (`<hex>.shard`, or the obsolete `.index` and
        `.data`), as the sharded readers name them; None for any other name."""
        stem, _, suffix = name.rpartition(".")
        if suffix not in suffixes or not stem or stem.strip("0123456789abcdef"):
            return None
        shard = int(stem, 16)
        return shard if shard < (1 << self.shard_bits) and self.shard_name(shard) == stem else None


# --------------------------------------------------------------------------- the key-value view


@dataclass(frozen=True, slots=True)
class Minishard:
    """Decoded minishard index: chunk ids sorted, absolute byte offsets in the shard, sizes;
    the version of the shard it was read from, and, for a version not settled, the proofs of
    the index bytes that located its chunks (`ChunkRef.evidence`)."""

    ids: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    version: Version | None = None
    proofs: tuple = ()

    @property
    def nbytes(self) -> int:
        return 3 * 8 * len(self.ids)


class ShardedKV:
    """Chunk id -> byte range, and id listings, for one sharded precomputed directory."""

    def __init__(self, store: Store, prefix: str, spec: ShardingSpec, cache: CoalescingCache, max_decoded: int = MAX_DECODED):
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.spec = spec
        self.cache = cache
        self.max_decoded = max_decoded

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def lazy(self) -> bool:
        """A shard index (16 bytes per minishard) larger than a quarter of the index cache is
        never loaded whole: a lookup reads its minishard's entry, a listing streams it."""
        return self.spec.shard_index_nbytes > max(self.cache.max_bytes // 4, 4096)

    async def _shard_index(self, shard: int, max_age: float | None = None) -> "_ShardIndex | None":
        """(data key, data offset shift, index array, version) of a shard; None if it does not
        exist. With `max_age`: first check that the shard did not change since its index was
        read (unless that was checked less than `max_age` seconds ago; 0: always).

        Offsets in minishard indexes count from the start of the `.shard` file; for the
        obsolete `.index` + `.data` pair they are shifted onto the `.data` file (whose changes
        are not tracked: that pair predates writers that rewrite in place)."""
        ck = ("ngshard", self.prefix, shard)
        if max_age is not None:
            await drop_if_changed(self.cache, ck, self.store, self._key(f"{self.spec.shard_name(shard)}.shard"), max_age)
        return await self.cache.get(ck, lambda: self._load_shard_index(shard))

    async def _load_shard_index(self, shard: int):
        name = self.spec.shard_name(shard)
        n = self.spec.shard_index_nbytes
        key, shift = self._key(f"{name}.shard"), 0
        lazy = self.lazy()
        raw, version = await self.store.read_version(key, 0, 16 if lazy else n)
        if raw is None:
            if lazy:  # (the obsolete pair predates indexes this large)
                return None
            raw = await self.store.read(self._key(f"{name}.index"))
            if raw is None:
                return None
            key, shift, version = self._key(f"{name}.data"), -n, None
        limit = 2**62 if version is None else version.size - (n if not shift else 0)
        if lazy:
            if version is not None and version.size < n:
                err = CorruptShardError(key, f"shard of {version.size} bytes is smaller than its index ({n} bytes)")
                err.version = version  # type: ignore[attr-defined]
                log.warning("%s", err)
                raise err
            return _ShardIndex(key, shift, None, version, limit)
        if len(raw) != n:
            err = CorruptShardError(key, f"shard index is {len(raw)} bytes, expected {n}")
            err.version = version  # type: ignore[attr-defined]
            log.warning("%s", err)
            raise err
        index = np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(np.uint64)
        if _bad_ranges(index, limit):
            err = CorruptShardError(key, "shard index has inverted minishard ranges or ranges past the shard's end")
            err.version = version  # type: ignore[attr-defined]
            log.warning("%s", err)
            raise err
        return _ShardIndex(key, shift, index, version, limit)

    async def _range(self, si: "_ShardIndex", minishard: int) -> tuple[int, int, bytes | None]:
        """(start, end) of a minishard's index in the shard's data, and the entry's stored bytes
        when they had to be read (a lazy shard index)."""
        if si.index is not None:
            start, end = si.index[minishard].tolist()
            return start, end, None
        raw = await self.store.read(si.key, 16 * minishard, 16, expect=si.version)
        entry = np.frombuffer(raw or b"", dtype="<u8").reshape(-1, 2).astype(np.uint64)
        if len(entry) != 1 or _bad_ranges(entry, si.limit):
            raise CorruptShardError(si.key, f"shard index entry {minishard} is truncated or points past the shard's end")
        start, end = entry[0].tolist()
        return start, end, raw

    async def _minishard(self, shard: int, minishard: int, fresh: bool = False) -> tuple["_ShardIndex", Minishard] | None:
        si = await self._shard_index(shard, 0.0 if fresh else None)
        if si is None:
            return None
        start, end, raw = await self._range(si, minishard)
        if start == end:
            return si, _EMPTY_MINISHARD
        tag = None if si.version is None else si.version.tag
        m = await self.cache.get(("ngmini", self.prefix, shard, tag, minishard),
                                 lambda: self._load_minishard(si, shard, minishard, start, end, raw))
        return si, m

    async def _load_minishard(self, si: "_ShardIndex", shard: int, minishard: int, start: int, end: int,
                              entry: bytes | None) -> Minishard:
        base = self.spec.shard_index_nbytes
        offset = base + start + si.shift
        try:
            stored = await self.store.read(si.key, offset, end - start, expect=si.version)
        except ShardChanged:
            self.cache.drop(("ngshard", self.prefix, shard))
            raise
        try:
            if stored is None or len(stored) != end - start:
                raise CorruptShardError(si.key, f"minishard index at {offset} is truncated")
            raw = stored
            if self.spec.minishard_index_encoding == "gzip":
                raw = gunzip(raw, "minishard index", si.key, limit=MAX_DECODED)
            if len(raw) % 24:
                raise CorruptShardError(si.key, f"minishard index of {len(raw)} bytes is not a multiple of 24")
            table = np.frombuffer(raw, dtype="<u8").reshape(3, -1)
            with np.errstate(over="ignore"):
                ids = np.cumsum(table[0], dtype=np.uint64)
                sizes = table[2].astype(np.uint64)
                # each start is relative to the end of the previous chunk
                ends_before = np.concatenate([[np.uint64(0)], np.cumsum(sizes, dtype=np.uint64)[:-1]])
                starts = np.cumsum(table[1], dtype=np.uint64) + ends_before + np.uint64(base)
            if len(starts) and (np.any(starts > np.uint64(2**62)) or np.any(sizes > np.uint64(2**62))):
                raise CorruptShardError(si.key, "minishard index points far past any plausible shard end")
        except CorruptShardError as e:
            e.version = si.version  # type: ignore[attr-defined]
            log.warning("%s", e)
            raise
        if si.shift and len(starts) and np.any(starts < np.uint64(-si.shift)):
            err = CorruptShardError(si.key, "minishard index points into the shard index")
            log.warning("%s", err)
            raise err
        order = np.argsort(ids, kind="stable")
        proofs = ()
        if si.version is not None and not si.version.settled:
            entry = entry if entry is not None else np.array([start, end], dtype="<u8").tobytes()
            proofs = (proof(16 * minishard, entry), proof(offset, stored))
        return Minishard(ids[order], starts[order] - np.uint64(-si.shift), sizes[order], si.version, proofs)

    async def locate(self, chunk_id: int, fresh: bool = True) -> ChunkRef | None:
        """Byte range of a chunk as stored (still encoded), or None if absent. `fresh`: the
        shard's index is first checked against the shard's current version (one stat locally,
        nothing remotely)."""
        shard, minishard = self.spec.locate(chunk_id)
        found = await self._minishard(shard, minishard, fresh)
        if found is None:
            return None
        si, m = found
        i = int(np.searchsorted(m.ids, np.uint64(chunk_id)))
        if i >= len(m.ids) or int(m.ids[i]) != chunk_id:
            return None
        return ChunkRef(si.key, int(m.starts[i]), int(m.sizes[i]), version=si.version, evidence=m.proofs or None)

    async def get_ref(self, chunk_id: int) -> ChunkRef | None:
        """Like `locate`, with the data encoding's decode step attached."""
        ref = await self.locate(chunk_id)
        if ref is None or self.spec.data_encoding == "raw":
            return ref
        return ChunkRef(ref.key, ref.offset, ref.length, _gunzip_chunk(ref.key, self.max_decoded), ref.version, ref.evidence)

    async def shards(self) -> list[int]:
        """Shard numbers that exist, from one listing of the directory when the store can list,
        else by probing the shard numbers concurrently (under the store's request limit)."""
        try:
            entries = await self.store.list(self.prefix)
        except StorageError as e:  # e.g. 403 for a directory on a server without index pages
            log.info("%s: cannot list (%s): probing shard names", self.prefix or "/", e)
            entries = None
        if not entries:  # cannot list (None), or an HTTP server without index pages ([])
            count = 1 << self.spec.shard_bits
            if count > MAX_PROBED_SHARDS:
                log.warning("%s: cannot list the directory and %d shard names are too many to probe: the listing is empty",
                            self.prefix or "/", count)
                return []
            found = await gather(lambda s=s: self.current_index(s) for s in range(count))
            return [s for s, si in enumerate(found) if si is not None]
        found = {self.spec.shard_of(e.name, ("shard", "index")) for e in entries}
        return sorted(found - {None})  # type: ignore[operator]

    async def current_index(self, shard: int) -> "_ShardIndex | None":
        """The shard's index, checked against its current version (within the last
        `LISTING_MAX_AGE`: listings use it); None for a missing or corrupt shard, or one that
        cannot be read (a FIFO, a device, a symlink leading outside: logged once). No room
        for its descriptor now fails the listing (as `ShardedArray._listed_head`)."""
        try:
            return await self._shard_index(shard, LISTING_MAX_AGE)
        except TooManyOpen:
            raise
        except CorruptShardError:
            return None
        except StorageError as e:
            if first_time(str(e)):
                log.warning("%s", e)
            return None

    async def _used_minishards(self, si: "_ShardIndex") -> np.ndarray:
        """The minishards of a shard that hold chunks (a lazy index is streamed in slices)."""
        if si.index is not None:
            return np.flatnonzero(si.index[:, 0] != si.index[:, 1])
        n, out = self.spec.shard_index_nbytes, []
        for off in range(0, n, LAZY_SLICE):
            raw = await self.store.read(si.key, off, min(LAZY_SLICE, n - off), expect=si.version)
            out.append(await decode_step(_used, raw or b"") + off // 16)  # (a worker thread: others go on)
        return np.concatenate(out)

    async def shard_entries(self, shard: int) -> "tuple[_ShardIndex, Minishard] | None":
        """Every chunk stored in one shard (ids, absolute starts, sizes, in minishard order) and
        the shard's index (its data key and version), checked against the shard's current
        version; None for a missing or corrupt shard (a corrupt minishard contributes none)."""
        si = await self.current_index(shard)
        if si is None:
            return None
        parts = []
        for minishard in await self._used_minishards(si):
            try:
                found = await self._minishard(shard, int(minishard))
            except CorruptShardError:
                continue
            if found:
                parts.append(found[1])
        if not parts:
            return si, _EMPTY_MINISHARD
        return si, Minishard(*(np.concatenate([getattr(m, f) for m in parts]) for f in ("ids", "starts", "sizes")))

    async def ids_in_shard(self, shard: int) -> np.ndarray:
        """Every chunk id stored in one shard (a corrupt shard or minishard contributes none)."""
        found = await self.shard_entries(shard)
        return found[1].ids if found is not None else np.zeros(0, dtype=np.uint64)

    async def all_ids(self) -> np.ndarray:
        ids = await gather(lambda s=s: self.ids_in_shard(s) for s in await self.shards())
        return distinct(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class _ShardIndex:
    """A shard's index (None when too large to hold: `ShardedKV.lazy`), where its data lives
    (`key`, `shift`), its version, and the end its minishard ranges must stay within."""

    key: str
    shift: int
    index: np.ndarray | None
    version: Version | None = None
    limit: int = 2**62

    @property
    def nbytes(self) -> int:
        return 64 if self.index is None else self.index.nbytes


def _used(raw: bytes) -> np.ndarray:
    """The minishards that hold chunks in a slice of a shard index."""
    part = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
    return np.flatnonzero(part[:, 0] != part[:, 1])


def _bad_ranges(index: np.ndarray, limit: int) -> bool:
    """Minishard ranges (start, end) that are inverted or end past `limit`."""
    return bool(np.any(index[:, 1] < index[:, 0]) or np.any(index[:, 1] > np.uint64(max(0, limit))))


_EMPTY_MINISHARD = Minishard(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64))


# --------------------------------------------------------------------------- Morton codes


def morton_bits(grid) -> tuple[int, ...]:
    return tuple(max(0, math.ceil(math.log2(g))) if g > 1 else 0 for g in grid)


def morton_encode(coords, bits) -> int:
    """Compressed Morton code: interleave bit i of each dimension while it has bits left."""
    out, j = 0, 0
    for i in range(max(bits, default=0)):
        for d, b in enumerate(bits):
            if i < b:
                out |= ((int(coords[d]) >> i) & 1) << j
                j += 1
    return out


def morton_decode(codes: np.ndarray, bits) -> np.ndarray:
    """Inverse of morton_encode for an array of codes: (n, ndim) int64 coordinates."""
    codes = np.asarray(codes, dtype=np.uint64)
    out = np.zeros((len(codes), len(bits)), dtype=np.uint64)
    j = 0
    for i in range(max(bits, default=0)):
        for d, b in enumerate(bits):
            if i < b:
                out[:, d] |= ((codes >> np.uint64(j)) & np.uint64(1)) << np.uint64(i)
                j += 1
    return out.astype(np.int64)


# --------------------------------------------------------------------------- info files


def check_name(name: Any, where: str, what: str) -> str:
    """A directory name taken from metadata: one path component, nothing that escapes."""
    if not isinstance(name, str) or not name or name in (".", "..") or "\0" in name or "/" in name.strip("/"):
        raise MetadataError(where, f"{what} {name!r} is not a plain directory name")
    return name.strip("/")


@dataclass(frozen=True)
class VolumeScale:
    key: str
    size: tuple[int, int, int]
    voxel_offset: tuple[int, int, int]
    chunk_size: tuple[int, int, int]
    sharding: ShardingSpec | None

    @property
    def grid(self) -> tuple[int, int, int]:
        return tuple(-(-s // c) for s, c in zip(self.size, self.chunk_size))  # type: ignore[return-value]

    @property
    def bits(self) -> tuple[int, ...]:
        return morton_bits(self.grid)

    def chunk_name(self, g) -> str:
        parts = []
        for d in range(3):
            lo = self.voxel_offset[d] + g[d] * self.chunk_size[d]
            hi = self.voxel_offset[d] + min((g[d] + 1) * self.chunk_size[d], self.size[d])
            parts.append(f"{lo}-{hi}")
        return "_".join(parts)

    _NAME = re.compile(r"(-?\d+)-(-?\d+)_(-?\d+)-(-?\d+)_(-?\d+)-(-?\d+)")

    def parse_chunk_name(self, name: str) -> tuple[int, int, int] | None:
        m = self._NAME.fullmatch(name)
        if not m:
            return None
        g = []
        for d in range(3):
            lo = int(m.group(2 * d + 1)) - self.voxel_offset[d]
            if lo % self.chunk_size[d] or not 0 <= lo // self.chunk_size[d] < self.grid[d]:
                return None
            g.append(lo // self.chunk_size[d])
        coords = tuple(g)
        return coords if self.chunk_name(coords) == name else None  # type: ignore[return-value]


def _triple(v: Any, where: str, what: str, positive: bool) -> tuple[int, int, int]:
    if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise MetadataError(where, f"{what} must be a list of 3 integers, got {json.dumps(v)[:60]}")
    if positive and any(x < 1 for x in v) or any(abs(x) >= 2**53 for x in v):
        raise MetadataError(where, f"{what} has an out-of-range value: {v}")
    return tuple(v)  # type: ignore[return-value]


def parse_scales(info: dict, where: str) -> list[VolumeScale]:
    scales = info.get("scales")
    if not isinstance(scales, list) or not scales:
        raise MetadataError(where, "scales must be a non-empty list")
    out = []
    for i, s in enumerate(scales):
        w = f"{where} (scale {i})"
        if not isinstance(s, dict):
            raise MetadataError(w, "scale is not a JSON object")
        key = check_name(s.get("key"), w, "scale key")
        size = _triple(s.get("size"), w, "size", positive=False)
        if any(x < 0 for x in size):
            raise MetadataError(w, f"size has a negative value: {list(size)}")
        offset = _triple(s.get("voxel_offset", [0, 0, 0]), w, "voxel_offset", positive=False)
        chunks = s.get("chunk_sizes")
        if not isinstance(chunks, list) or not chunks:
            raise MetadataError(w, "chunk_sizes must be a non-empty list")
        chunk = _triple(chunks[0], w, "chunk_sizes[0]", positive=True)
        sharding = ShardingSpec.parse(s["sharding"], w) if s.get("sharding") is not None else None
        out.append(VolumeScale(key, size, offset, chunk, sharding))
    return out


def manifest_fragment_bytes(manifest: bytes, key: str) -> int:
    """Total size of a multiresolution mesh's fragment data, from its manifest."""
    try:
        num_lods = struct.unpack_from("<I", manifest, 24)[0]
        if num_lods > 64:
            raise CorruptShardError(key, f"mesh manifest claims {num_lods} levels of detail")
        pos = 28 + 4 * num_lods + 12 * num_lods
        counts = struct.unpack_from(f"<{num_lods}I", manifest, pos)
        pos += 4 * num_lods
        total = 0
        for n in counts:
            pos += 12 * n
            sizes = np.frombuffer(manifest, dtype="<u4", count=n, offset=pos)
            total += int(sizes.sum(dtype=np.uint64))
            pos += 4 * n
    except (struct.error, ValueError):
        raise CorruptShardError(key, "mesh manifest is truncated") from None
    if pos != len(manifest):
        raise CorruptShardError(key, f"mesh manifest has {len(manifest) - pos} trailing bytes")
    return total


def unsharded_info(info: dict) -> dict:
    """The info file of the unsharded equivalent: every `sharding` member dropped (scales,
    the top level of mesh/skeleton info, annotation by_id/relationships/spatial entries)."""
    out = {k: v for k, v in info.items() if k != "sharding"}
    for list_key in ("scales", "relationships", "spatial"):
        if isinstance(out.get(list_key), list):
            out[list_key] = [{k: v for k, v in e.items() if k != "sharding"} if isinstance(e, dict) else e for e in out[list_key]]
    if isinstance(out.get("by_id"), dict):
        out["by_id"] = {k: v for k, v in out["by_id"].items() if k != "sharding"}
    return out



# --------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class ShardedDir:
    """One sharded directory of a dataset and how its unsharded names are made.

    kind: "volume" (Morton-coded chunks named by voxel ranges), "skeletons" and "ids" (one file
    per id), "mesh" (multiresolution: `<id>.index` manifest + `<id>` fragment data), "spatial"
    (annotation cells named `c0_c1_...` by Morton code over `grid_shape`).
    """

    path: str
    kind: str
    spec: ShardingSpec
    scale: VolumeScale | None = None
    grid_shape: tuple[int, ...] | None = None
    info: dict | None = None  # the directory's own info file (mesh, skeletons), if it has one


@dataclass
class Dataset:
    info: dict
    sharded: dict[str, ShardedDir]  # by directory path
    kind: str  # "volume" or "annotations"
    versions: dict[str, Version] = field(default_factory=dict)  # info file path -> its stored version


async def _sub_info(store: Store, path: str, where: str, versions: dict, max_metadata: int | None,
                    tally: MetadataTally) -> dict | None:
    raw, version = await read_metadata(store, f"{path}/{INFO}", f"{where}/{path}/{INFO}", max_metadata, tally)
    if version is not None:
        versions[f"{path}/{INFO}"] = version
    return None if raw is None else parse_json_object(raw, f"{where}/{path}/{INFO}", "info")


async def load_dataset(store: Store, max_metadata: int | None = None) -> Dataset:
    """Read and check every info file that decides the unsharded tree (each within
    `max_metadata`, and all of them together: jsonfile.read_metadata)."""
    where = store.display
    tally = MetadataTally()
    raw, version = await read_metadata(store, INFO, f"{where}/{INFO}", max_metadata, tally)
    if raw is None:
        raise MetadataError(where, "no info file at the root (not a precomputed dataset)")
    info = parse_json_object(raw, f"{where}/{INFO}", "info")
    sharded: dict[str, ShardedDir] = {}
    versions = {} if version is None else {INFO: version}
    if info.get("@type") == "neuroglancer_annotations_v1":
        w = f"{where}/{INFO}"
        entries = []
        if isinstance(info.get("by_id"), dict):
            entries.append(("ids", info["by_id"], None))
        for rel in info.get("relationships") or []:
            entries.append(("ids", rel, None))
        for sp in info.get("spatial") or []:
            gs = sp.get("grid_shape") if isinstance(sp, dict) else None
            if not (isinstance(gs, list) and gs and all(isinstance(g, int) and 0 < g < 2**32 for g in gs)):
                raise MetadataError(w, f"spatial grid_shape {gs!r} is not a list of positive integers")
            entries.append(("spatial", sp, tuple(gs)))
        for kind, entry, grid in entries:
            if not isinstance(entry, dict):
                raise MetadataError(w, "annotation index entry is not a JSON object")
            key = check_name(entry.get("key"), w, "annotation index key")
            if entry.get("sharding") is not None:
                sharded[key] = ShardedDir(key, kind, ShardingSpec.parse(entry["sharding"], w), grid_shape=grid)
        return Dataset(info, sharded, "annotations", versions)

    for scale in parse_scales(info, f"{where}/{INFO}"):
        if scale.sharding is not None:
            sharded[scale.key] = ShardedDir(scale.key, "volume", scale.sharding, scale=scale)
    for member, kind in (("mesh", "mesh"), ("skeletons", "skeletons")):
        if member not in info:
            continue
        path = check_name(info[member], f"{where}/{INFO}", member)
        sub = await _sub_info(store, path, where, versions, max_metadata, tally)
        if sub is None or sub.get("sharding") is None:
            continue  # legacy or unsharded: shown as stored
        w = f"{where}/{path}/{INFO}"
        if kind == "mesh" and sub.get("@type") != "neuroglancer_multilod_draco":
            raise MetadataError(w, f"sharded mesh of @type {sub.get('@type')!r} (only multiresolution meshes are sharded)")
        sharded[path] = ShardedDir(path, kind, ShardingSpec.parse(sub["sharding"], w), info=sub)
    return Dataset(info, sharded, "volume", versions)
