"""Zarr v3 arrays and groups, and the `sharding_indexed` codec (ZEP 2).

`load_hierarchy` reads and validates every node's `zarr.json` once, at mount time, so bad
metadata fails the mount with one line instead of failing reads later. For each sharded array,
`plan_sharding` works out the chain of sharding levels (nested sharding, transposes placed
before a sharding codec) down to the innermost chunks; `ShardedArray` then maps an innermost
chunk to the byte range that holds it, and lists the chunks a shard holds, using the shard
indexes (cached and coalesced by `storage.cache`).

Arrays whose chunks cannot be reached as byte ranges (a bytes->bytes codec after sharding, an
inner shape that does not divide the shard, storage transformers, index codecs we cannot
decode) are not errors: they are shown as stored, with a warning.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from dataclasses import dataclass, field
from contextlib import aclosing
from typing import Any, AsyncIterator, Callable, Iterator

import crc32c
import numpy as np
import trio

from ..errors import CorruptShardError, MetadataError, ShardChanged, StorageError, TooManyOpen, first_time
from ..storage.base import Entries, Store, Version, proof
from ..storage.cache import LISTING_MAX_AGE, CoalescingCache, drop_if_changed
from ..storage.gather import gather
from .array import ArrayModel, GroupModel, Hierarchy
from .chunkref import ChunkRef
from .codecs import decode_step
from .jsonfile import MetadataTally, parse_json_object, read_metadata

log = logging.getLogger("zvfs.zarr3")

META = "zarr.json"
MAX_CHUNKS = 2**48  # chunk files one array may have (inode numbers are computed from positions)
EMPTY = np.uint64(2**64 - 1)
_BAD = np.uint64(2**64 - 2)  # offset marker for an entry that points outside its shard
_EMPTY_INT, _BAD_INT = int(EMPTY), int(_BAD)
_NOT_CACHED = object()


# --------------------------------------------------------------------------- metadata


def _ints(value: Any, where: str, what: str, positive: bool) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise MetadataError(where, f"{what} must be a list of integers, got {json.dumps(value)[:60]}")
    low = 1 if positive else 0
    if any(v < low or v >= 2**62 for v in value):
        raise MetadataError(where, f"{what} has an out-of-range value: {value}")
    return tuple(value)


def _codec_name(codec: Any, where: str) -> str:
    if isinstance(codec, str):
        return codec
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        return codec["name"]
    raise MetadataError(where, f"malformed codec entry {json.dumps(codec)[:60]}")


def _codec_config(codec: Any) -> dict:
    return codec.get("configuration") or {} if isinstance(codec, dict) else {}


@dataclass(frozen=True)
class ChunkKeyEncoding:
    """The array's `chunk_key_encoding`: names shards in the store and chunks in the view."""

    name: str  # "default" or "v2"
    separator: str  # "/" or "."

    @classmethod
    def parse(cls, meta: dict, where: str) -> "ChunkKeyEncoding":
        enc = meta.get("chunk_key_encoding", {"name": "default"})
        name = _codec_name(enc, where)
        if name not in ("default", "v2"):
            raise MetadataError(where, f"unknown chunk_key_encoding {name!r}")
        sep = _codec_config(enc).get("separator", "/" if name == "default" else ".")
        if sep not in ("/", "."):
            raise MetadataError(where, f"chunk_key_encoding separator must be '/' or '.', got {sep!r}")
        return cls(name, sep)

    def key(self, coords) -> str:
        if self.name == "default":
            return self.separator.join(["c", *map(str, coords)])
        return self.separator.join(map(str, coords)) if len(coords) else "0"


@dataclass(frozen=True)
class Level:
    """One `sharding_indexed` codec in the chain, seen from the array's axes.

    `shard_shape` and `inner_shape` are in array axis order; `perm[i]` is the array axis that
    is axis i of this level's (transposed) shard, whose inner grid `grid` the index covers in
    C order.
    """

    shard_shape: tuple[int, ...]
    inner_shape: tuple[int, ...]
    perm: tuple[int, ...]
    grid: tuple[int, ...]
    index_location: str
    index_dtype: str  # "<u8" or ">u8"
    index_crc: bool

    @property
    def n(self) -> int:
        return math.prod(self.grid)

    @property
    def index_nbytes(self) -> int:
        return 16 * self.n + (4 if self.index_crc else 0)


@dataclass(frozen=True)
class ShardPlan:
    levels: tuple[Level, ...]
    chunk_shape: tuple[int, ...]  # innermost chunk shape, array order
    codecs: list  # codec chain of the unsharded equivalent

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return self.levels[0].shard_shape


class NotUnshardable(Exception):
    """Why a sharded array is shown as stored (message goes to the log and `inspect`)."""


def _parse_index_codecs(codecs: Any, where: str) -> tuple[str, bool]:
    if not isinstance(codecs, list):
        raise MetadataError(where, "sharding index_codecs must be a list")
    names = [_codec_name(c, where) for c in codecs]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        raise NotUnshardable(f"index codecs {names} are not bytes[+crc32c]")
    endian = _codec_config(codecs[0]).get("endian", "little")
    if endian not in ("little", "big"):
        raise MetadataError(where, f"index bytes codec endian must be little or big, got {endian!r}")
    return ("<u8" if endian == "little" else ">u8"), len(names) == 2


def _transpose_order(codec: Any, ndim: int, where: str) -> tuple[int, ...]:
    order = _codec_config(codec).get("order")
    if order == "C":
        return tuple(range(ndim))
    if order == "F":
        return tuple(reversed(range(ndim)))
    if not isinstance(order, list) or sorted(order) != list(range(ndim)):
        raise MetadataError(where, f"transpose order {order!r} is not a permutation of {ndim} axes")
    return tuple(order)


def plan_sharding(meta: dict, shape: tuple[int, ...], chunk_shape: tuple[int, ...], where: str) -> ShardPlan | None:
    """The sharding levels of an array, or None if its codecs hold no `sharding_indexed`.

    Raises NotUnshardable when the array is sharded but its chunks are not byte ranges of the
    shards, and MetadataError when the metadata is wrong.
    """
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or not codecs:
        raise MetadataError(where, "codecs must be a non-empty list")
    if not any(_codec_name(c, where) == "sharding_indexed" for c in codecs):
        return None
    if meta.get("storage_transformers"):
        raise NotUnshardable("storage transformers are present")
    ndim = len(shape)
    levels: list[Level] = []
    perm = tuple(range(ndim))
    shard_shape = chunk_shape  # array order
    while True:
        names = [_codec_name(c, where) for c in codecs]
        if "sharding_indexed" not in names:
            break
        at = names.index("sharding_indexed")
        for c, name in zip(codecs[:at], names[:at]):
            if name != "transpose":
                raise NotUnshardable(f"array->array codec {name!r} stands before sharding")
            order = _transpose_order(c, ndim, where)
            perm = tuple(perm[o] for o in order)
        if at != len(codecs) - 1:
            raise NotUnshardable(f"bytes->bytes codec {names[at + 1]!r} stands after sharding")
        conf = _codec_config(codecs[at])
        inner_level = _ints(conf.get("chunk_shape"), where, "sharding chunk_shape", positive=True)
        if len(inner_level) != ndim:
            raise MetadataError(where, f"sharding chunk_shape {list(inner_level)} has the wrong rank")
        shard_level = tuple(shard_shape[p] for p in perm)
        if any(s % i for s, i in zip(shard_level, inner_level)):
            raise NotUnshardable(f"inner chunk shape {list(inner_level)} does not divide shard shape {list(shard_level)}")
        location = conf.get("index_location", "end")
        if location not in ("start", "end"):
            raise MetadataError(where, f"sharding index_location must be start or end, got {location!r}")
        index_dtype, index_crc = _parse_index_codecs(conf.get("index_codecs", [{"name": "bytes"}, {"name": "crc32c"}]), where)
        inner = [0] * ndim
        for i, p in enumerate(perm):
            inner[p] = inner_level[i]
        grid = tuple(s // i for s, i in zip(shard_level, inner_level))
        levels.append(Level(shard_shape, tuple(inner), perm, grid, location, index_dtype, index_crc))
        shard_shape = tuple(inner)
        codecs = conf.get("codecs")
        if not isinstance(codecs, list) or not codecs:
            raise MetadataError(where, "sharding codecs must be a non-empty list")
    prefix = [] if perm == tuple(range(ndim)) else [{"name": "transpose", "configuration": {"order": list(perm)}}]
    return ShardPlan(tuple(levels), shard_shape, prefix + list(codecs))


# --------------------------------------------------------------------------- hierarchy


@dataclass
class ArrayNode:
    path: str  # "" for a root array, else "a/b"
    meta: dict
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]  # of the stored chunk grid (the shard shape when sharded)
    encoding: ChunkKeyEncoding
    plan: ShardPlan | None = None
    warning: str | None = None  # set when sharded but shown as stored
    version: Version | None = None  # of the stored zarr.json (its mtime and mode dress the rewrite)

    @property
    def sharded(self) -> bool:
        return self.plan is not None or self.warning is not None

    def store_key(self, key: str) -> str:
        return f"{self.path}/{key}" if self.path else key

    def row_dir(self, prefix: tuple[int, ...]) -> str | None:
        """The store directory that holds the keys (of shards, or of chunks when unsharded)
        whose first grid coordinates are `prefix`: `c/1/2` of `c/1/2/3`, `c` of `()`. None
        where keys are not nested (a `.` separator: every key in one directory)."""
        if self.encoding.separator != "/" or not self.shape:
            return None
        parts = (["c"] if self.encoding.name == "default" else []) + [str(c) for c in prefix]
        return self.store_key("/".join(parts)) if parts else self.path


@dataclass
class GroupNode:
    path: str
    meta: dict
    raw: bytes = b""  # the stored zarr.json, served as is when nothing needs rewriting
    children: list[str] = field(default_factory=list)  # names of child nodes (arrays/groups)
    version: Version | None = None  # of the stored zarr.json


def parse_array(path: str, meta: dict, where: str) -> ArrayNode:
    shape = _ints(meta.get("shape"), where, "shape", positive=False)
    grid = meta.get("chunk_grid")
    if _codec_name(grid, where) != "regular":
        raise MetadataError(where, f"unsupported chunk_grid {_codec_name(grid, where)!r}")
    chunk_shape = _ints(_codec_config(grid).get("chunk_shape"), where, "chunk_shape", positive=True)
    if len(chunk_shape) != len(shape):
        raise MetadataError(where, f"chunk_shape {list(chunk_shape)} and shape {list(shape)} differ in rank")
    if "data_type" not in meta:
        raise MetadataError(where, "data_type is missing")
    node = ArrayNode(path, meta, shape, chunk_shape, ChunkKeyEncoding.parse(meta, where))
    try:
        node.plan = plan_sharding(meta, shape, chunk_shape, where)
    except NotUnshardable as e:
        node.warning = f"shown as stored: {e}"
    inner = node.plan.chunk_shape if node.plan else chunk_shape
    chunks = math.prod(-(-s // c) for s, c in zip(shape, inner))
    if chunks > MAX_CHUNKS:
        raise MetadataError(where, f"absurd chunk grid: {chunks} chunks (more than {MAX_CHUNKS})")
    return node


def parse_node(path: str, raw: bytes, where: str) -> ArrayNode | GroupNode:
    meta = parse_json_object(raw, where)
    if meta.get("zarr_format") != 3:
        raise MetadataError(where, f"zarr_format must be 3, got {meta.get('zarr_format')!r}")
    kind = meta.get("node_type")
    if kind == "array":
        return parse_array(path, meta, where)
    if kind == "group":
        return GroupNode(path, meta, raw)
    raise MetadataError(where, f"node_type must be 'array' or 'group', got {kind!r}")


def child_path(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


async def load_hierarchy(store: Store, max_metadata: int | None = None) -> dict[str, ArrayNode | GroupNode]:
    """Every group and array below the root, keyed by path ("" is the root).

    Directories without a `zarr.json` are not descended into (they are not Zarr nodes and are
    shown as plain directories); arrays are not descended into either. Every `zarr.json` is
    read within `max_metadata` (jsonfile.read_metadata: the size known before it is parsed),
    all of them together too (they are kept for the life of the mount).
    """
    tally = MetadataTally()
    raw, version = await read_metadata(store, META, f"{store.display}/{META}", max_metadata, tally)
    if raw is None:
        raise MetadataError(store.display, "no zarr.json at the root (not a Zarr v3 store)")
    nodes: dict[str, ArrayNode | GroupNode] = {}
    todo = [("", raw, version)]
    while todo:
        path, raw, version = todo.pop()
        where = f"{store.display}/{child_path(path, META)}"
        node = nodes[path] = parse_node(path, raw, where)
        node.version = version
        if node.warning if isinstance(node, ArrayNode) else False:
            log.warning("%s: %s", where, node.warning)
        if isinstance(node, GroupNode):
            for entry in sorted(await store.list(path) or [], key=lambda e: e.name):
                if not entry.is_dir:
                    continue
                sub = child_path(path, entry.name)
                child_raw, child_version = await read_metadata(store, f"{sub}/{META}", f"{store.display}/{sub}/{META}",
                                                               max_metadata, tally)
                if child_raw is not None:
                    node.children.append(entry.name)
                    todo.append((sub, child_raw, child_version))
    return nodes


# --------------------------------------------------------------------------- shard indexes


@dataclass(frozen=True, slots=True)
class ShardIndex:
    """Decoded `(offset, nbytes)` pairs (native uint64, C order over the level's inner grid).

    Entries pointing outside their container are marked bad (offset `_BAD`): their chunk is
    EIO while the rest of the shard stays readable. `version` is the version of the shard
    object the index was read from (top level only): every byte range taken from the index
    is read expecting it. `at` is where the index lies in the shard (for `ChunkRef.evidence`).
    """

    entries: np.ndarray
    version: Version | None = None
    at: int = 0

    @property
    def nbytes(self) -> int:
        return self.entries.nbytes

    def present(self) -> np.ndarray:
        return _stored(self.entries)


@dataclass(frozen=True, slots=True)
class LazyIndex:
    """A shard index too large for the index cache (`ShardedArray.lazy`): never held whole. Its
    crc32c was checked once, streaming it in slices; a lookup reads its one entry, a listing
    streams slices. Kept in the cache in place of the entries (a few numbers)."""

    level: Level
    at: int  # where the index lies in the shard
    container: int | None  # the byte length its entries may point into
    version: Version | None
    nbytes = 64

    def decode(self, raw: bytes) -> np.ndarray:
        """Entries decoded from `raw` (a slice of the index), bounds checked."""
        entries = np.frombuffer(raw, dtype=self.level.index_dtype).reshape(-1, 2).astype(np.uint64)
        return _bounded(entries, self.level, self.container)[0]


def _stored(entries: np.ndarray) -> np.ndarray:
    """Rows of (offset, length) index entries that hold a chunk: neither empty nor bad (the two
    markers are the largest offsets)."""
    return np.flatnonzero(entries[:, 0] < _BAD)


def decode_index(raw: bytes, level: Level, key: str, container: int | None, version: Version | None = None,
                 at: int = 0) -> ShardIndex:
    """Check and decode one shard index. `container` is the byte length of the shard (or
    nested shard) when known, to reject entries that point past its end."""
    n = level.n
    if len(raw) != level.index_nbytes:
        raise CorruptShardError(key, f"shard index is {len(raw)} bytes, expected {level.index_nbytes}")
    body = raw[: 16 * n]
    if level.index_crc:
        stored = int.from_bytes(raw[16 * n :], "little")
        if crc32c.crc32c(body) != stored:
            raise CorruptShardError(key, "shard index checksum (crc32c) mismatch")
    entries, bad = _bounded(np.frombuffer(body, dtype=level.index_dtype).reshape(n, 2).astype(np.uint64), level, container)
    if bad:
        log.warning("corrupt shard %s: %d index entries point outside the shard", key, bad)
    return ShardIndex(entries, version, at)


def _bounded(entries: np.ndarray, level: Level, container: int | None) -> tuple[np.ndarray, int]:
    """Entries with the empty marker normalised and those pointing outside the container marked
    bad; and how many were bad."""
    off, nb = entries[:, 0], entries[:, 1]
    empty = (off == EMPTY) & (nb == EMPTY)
    at_start = level.index_location == "start"
    lo = np.uint64(level.index_nbytes if at_start else 0)
    hi = np.uint64(2**63 if container is None else max(0, container - (0 if at_start else level.index_nbytes)))
    bad = ~empty & ((off < lo) | (off > hi) | (nb > hi - np.minimum(off, hi)))
    count = int(bad.sum())
    if count:
        entries = entries.copy()
        entries[bad, 0] = _BAD
    entries[empty, 0] = EMPTY
    return entries, count


def _entry_bytes(level: Level, off: int, nb: int) -> bytes:
    """An index entry as stored (for `ChunkRef.evidence`)."""
    return np.array([off, nb], dtype=level.index_dtype).tobytes()


@dataclass(frozen=True, slots=True)
class ChunkTable:
    """Chunks and where their bytes are: grid coordinates (m, ndim, array order, C-sorted),
    byte offsets and lengths, in one store key (a shard) or one key per row (unsharded)."""

    coords: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    key: str | None = None
    keys: list[str] | None = None
    version: Version | None = None  # of `key`, the shard the table was read from

    @property
    def nbytes(self) -> int:
        return self.coords.nbytes + self.offsets.nbytes + self.lengths.nbytes + 64 * len(self.keys or ())

    def ref(self, i: int) -> ChunkRef:
        key = self.key if self.keys is None else self.keys[i]
        return ChunkRef(key, self.offsets.item(i), self.lengths.item(i), None, self.version)  # item(): a Python int


def _chunks_key(key: str, head: ShardIndex) -> tuple:
    """The cache key of a shard's chunk table: per shard version."""
    return ("chunks", key, None if head.version is None else head.version.tag)


def _empty_table(ndim: int, key: str | None = None) -> ChunkTable:
    return ChunkTable(np.zeros((0, ndim), np.int64), np.zeros(0, np.uint64), np.zeros(0, np.uint64), key)


def _c_sorted(coords: np.ndarray, *columns: np.ndarray) -> tuple:
    if coords.shape[1] == 0 or not len(coords):
        return (coords, *columns)
    order = np.lexsort(coords.T[::-1])
    return (coords[order], *(c[order] for c in columns))


#: a listing enumerates the shard grid itself up to this many shard positions (one index read
#: each, which it needs anyway); past it, the shards come from the store's own listing, so an
#: array of 10**12 mostly unwritten shards lists in time proportional to the shards stored
ENUMERATE_SHARDS = 4096
#: past it, sibling directories of a nested shard grid listed at once (each in a worker thread
#: locally, a request remotely), and shards a listing hands on at once
LIST_DIRS_AT_ONCE = 16
SHARDS_AT_ONCE = 4096

#: shards of more chunks than this are never made into chunk tables for listings (one index
#: level): a directory takes its rows from the cached index by slicing it. An N5 path fixes
#: the trailing axes, so each directory needs a row of every shard along the leading one; the
#: tables of ten 10^5-chunk shards (4 MiB each) evicted each other from the index cache and
#: every directory rebuilt them all: 81 ms per directory of 100 files
TABLE_MAX_CHUNKS = 1 << 14
#: bytes of a lazy index read at once when it is checked (fewer under a small index cache)
LAZY_SLICE = 4 << 20
#: index entries a listing reads and reduces at once (1 MiB of index; what a slice of them
#: takes as coordinates is the listing's largest temporary)
LIST_SLICE = 1 << 16
#: bytes of chunk tables a listing has in flight at once (shards read concurrently)
SCAN_BYTES = 4 << 20

#: `ShardedArray.scan` hands its tables to a function `visit(table, matched)`: `matched`
#: says every row has the fixed coordinates (else the table is C-sorted, and the caller
#: picks the rows)
Visit = Callable[["ChunkTable", bool], None]
#: and may be asked `wanted(shard)`, with a shard's coordinates or the leading ones of a
#: directory of shards: False when nothing under it can add to the listing
Wanted = Callable[[tuple[int, ...]], bool]


class ShardedArray:
    """Chunk location and listing for one sharded array whose plan is known."""

    def __init__(self, node: ArrayNode, store: Store, cache: CoalescingCache):
        assert node.plan is not None
        self.node = node
        self.plan = node.plan
        self.store = store
        self.cache = cache
        self.ndim = len(node.shape)
        self.chunk_shape = np.array(self.plan.chunk_shape, dtype=np.int64)
        self.shard_shape = np.array(self.plan.shard_shape, dtype=np.int64)
        self.grid = tuple(-(-s // c) for s, c in zip(node.shape, self.plan.chunk_shape))
        self.shard_grid = tuple(-(-s // c) for s, c in zip(node.shape, self.plan.shard_shape))
        #: how many innermost chunks one shard spans along each axis
        self.per_shard = tuple(int(s // c) for s, c in zip(self.shard_shape, self.chunk_shape))
        #: per sharding level, in innermost-chunk units: (inner chunk span per array axis,
        #: the level's axis order, its inner grid), for `locate`'s integer arithmetic
        self._steps = [(tuple(i // c for i, c in zip(lv.inner_shape, self.plan.chunk_shape)), lv.perm, lv.grid)
                       for lv in self.plan.levels]
        self._keys: dict[tuple[int, ...], str] = {}  # shard coordinates -> store key (bounded)
        #: one index level in array axis order: a shard's chunks come out of its index in C
        #: order of their coordinates, and need no sort (a third of a shard table's making)
        self._walks_in_c_order = len(self.plan.levels) == 1 and self.plan.levels[0].perm == tuple(range(self.ndim))
        #: listings slice the index instead of tabulating the shard (see `TABLE_MAX_CHUNKS`)
        self._sliced_index = len(self.plan.levels) == 1 and (self.plan.levels[0].n > TABLE_MAX_CHUNKS or self.lazy(self.plan.levels[0]))
        #: nested sharding with more chunks per shard than that: listings walk the inner
        #: indexes one at a time, keeping only a directory's rows (a shard table of n1 x n2
        #: chunks, each index within the cache, could take GiBs)
        self._walked = len(self.plan.levels) > 1 and math.prod(lv.n for lv in self.plan.levels) > TABLE_MAX_CHUNKS
        #: bytes of a lazy index read at once when it is checked, and entries when it is listed:
        #: a slice in flight is memory outside the caches, so a small budget takes smaller ones
        self._lazy_slice = min(LAZY_SLICE, max(1 << 20, self.cache.max_bytes))
        self._list_slice = min(LIST_SLICE, max(1 << 14, self.cache.max_bytes // 64))

    def row_dir(self, prefix: tuple[int, ...]) -> str | None:
        return self.node.row_dir(prefix)

    def shard_key(self, shard: tuple[int, ...]) -> str:
        key = self._keys.get(shard)
        if key is None:
            if len(self._keys) > 65536:
                self._keys.clear()
            key = self._keys[shard] = self.node.store_key(self.node.encoding.key(shard))
        return key

    def lazy(self, level: Level) -> bool:
        """A level whose index is larger than a quarter of the index cache is never loaded
        whole (`LazyIndex`): one index of 2**26 entries (1 GiB) took 3.3 GiB and 5-17 s per
        lookup, again on every lookup, when it was."""
        return level.index_nbytes > max(self.cache.max_bytes // 4, 4096)

    async def head(self, key: str, max_age: float | None = None) -> ShardIndex | LazyIndex | None:
        """The top-level index of shard `key` (None if the shard object does not exist).

        With `max_age`, a cached index is first checked against the shard's current version
        (unless it was less than `max_age` seconds ago) and read again if the shard changed:
        opening a chunk file (0: always), listing a directory (`LISTING_MAX_AGE`)."""
        ck = ("head", key)
        if max_age is not None and await drop_if_changed(self.cache, ck, self.store, key, max_age):
            found = self.cache.hit(ck, _NOT_CACHED)  # (evicted meanwhile: loaded again)
            if found is not _NOT_CACHED:
                return found
        return await self.cache.get(ck, lambda: self._load_head(key))

    async def _load_head(self, key: str) -> ShardIndex | LazyIndex | None:
        level = self.plan.levels[0]
        size = level.index_nbytes
        at_start = level.index_location == "start"
        lazy = self.lazy(level)
        want = (0, 16) if lazy and at_start else (-4, None) if lazy else (0, size) if at_start else (-size, None)
        raw, version = await self.store.read_version(key, *want)
        if raw is None:
            return None
        try:
            total = None if version is None else version.size
            at = 0 if at_start else (total or len(raw)) - size
            if lazy:
                return await self._lazy_index(key, level, at, total, 0, version)
            return decode_index(raw, level, key, total, version, at)
        except CorruptShardError as e:
            e.version = version  # type: ignore[attr-defined]  # (a rewrite may repair it)
            log.warning("%s", e)
            raise

    async def _lazy_index(self, key: str, level: Level, at: int, container: int | None, start: int,
                          version: Version | None) -> LazyIndex:
        """A `LazyIndex`, once its crc32c is checked by streaming the index in slices."""
        if at < start or container is not None and at + level.index_nbytes > start + container:
            raise CorruptShardError(key, f"shard of {container} bytes is smaller than its index ({level.index_nbytes} bytes)")
        crc, body, step = 0, 16 * level.n, self._lazy_slice
        for off in range(0, body, step):
            part = await self.store.read(key, at + off, min(step, body - off), expect=version)
            if part is None or len(part) != min(step, body - off):
                raise CorruptShardError(key, "shard index is truncated")
            if level.index_crc:  # (in a worker thread: other requests go on meanwhile)
                crc = await decode_step(crc32c.crc32c, part, crc)
            else:
                await trio.lowlevel.checkpoint()
        if level.index_crc:
            stored = await self.store.read(key, at + body, 4, expect=version)
            if stored is None or int.from_bytes(stored, "little") != crc:
                raise CorruptShardError(key, "shard index checksum (crc32c) mismatch")
        return LazyIndex(level, at, container, version)

    async def index(self, key: str, start: int, length: int | None, depth: int,
                    head: ShardIndex | LazyIndex | None = None) -> ShardIndex | LazyIndex | None:
        """The index of the (nested) shard at `[start, start+length)` of `key`, read from the
        version of the shard that `head` (its top-level index) describes."""
        if depth == 0:
            return await self.head(key)
        version = head.version if head is not None else None
        tag = None if version is None else version.tag
        return await self.cache.get((key, tag, start, depth), lambda: self._load_nested(key, start, length, depth, version))

    async def _load_nested(self, key: str, start: int, length: int | None, depth: int,
                           version: Version | None) -> ShardIndex | LazyIndex:
        level = self.plan.levels[depth]
        size = level.index_nbytes
        assert length is not None
        if length < size:
            raise CorruptShardError(key, f"nested shard of {length} bytes is smaller than its index")
        at = start if level.index_location == "start" else start + length - size
        try:
            if self.lazy(level):
                return await self._lazy_index(key, level, at, length, start, version)
            raw = await self.store.read(key, at, size, expect=version)
        except ShardChanged:
            self.cache.drop(("head", key))
            raise
        if raw is None:
            raise CorruptShardError(key, "shard disappeared while reading a nested index")
        try:
            return decode_index(raw, level, key, length, version, at)
        except CorruptShardError as e:
            log.warning("%s", e)
            raise

    async def _entry(self, key: str, idx: ShardIndex | LazyIndex, lin: int) -> tuple[int, int, bytes | None]:
        """(offset, nbytes) of entry `lin` of an index, and its stored bytes when they are
        needed as evidence (an unsettled version) or had to be read (a lazy index)."""
        if isinstance(idx, ShardIndex):
            off, nb = idx.entries[lin].tolist()
            return off, nb, None
        raw = await self.store.read(key, idx.at + 16 * lin, 16, expect=idx.version)
        if raw is None or len(raw) != 16:
            raise CorruptShardError(key, "shard index is truncated")
        off, nb = idx.decode(raw)[0].tolist()
        return off, nb, raw

    def in_grid(self, coords: tuple[int, ...]) -> bool:
        return len(coords) == self.ndim and all(0 <= c < g for c, g in zip(coords, self.grid))

    async def locate(self, coords: tuple[int, ...]) -> ChunkRef | None:
        """Byte range of innermost chunk `coords` (grid coordinates, array order), or None when
        the chunk is empty or its shard is missing. Raises CorruptShardError for a bad shard.
        The shard's index is first checked against the shard's current version (one stat
        locally, nothing remotely), so a lookup or open never uses the index of an old shard.

        Plain integer arithmetic in chunk units: this runs on every lookup and open (measured
        14.5 us per call in element units with lists per level, against the ~90 us pyfuse3
        spends per open)."""
        if len(coords) != self.ndim:
            return None
        shard, rel = [], []
        for c, p, g in zip(coords, self.per_shard, self.grid):
            if not 0 <= c < g:
                return None
            q, r = divmod(c, p)
            shard.append(q)
            rel.append(r)
        key = self.shard_key(tuple(shard))
        head = await self.head(key, max_age=0.0)
        if head is None:
            return None
        proofs = None if head.version is None or head.version.settled else []
        start, length, idx = 0, None, head
        for depth, (span, perm, grid) in enumerate(self._steps):
            lin = 0
            for axis, g in zip(perm, grid):
                lin = lin * g + rel[axis] // span[axis]
            if depth:
                idx = await self.index(key, start, length, depth, head)
            off, nb, raw = await self._entry(key, idx, lin)
            if off == _EMPTY_INT:
                return None
            if off == _BAD_INT:
                raise CorruptShardError(key, f"index entry {lin} points outside the shard")
            if proofs is not None:
                proofs.append(proof(idx.at + 16 * lin, raw or _entry_bytes(idx.level if isinstance(idx, LazyIndex)
                                                                          else self.plan.levels[depth], off, nb)))
            start, length = start + off, nb
            rel = [r % q for r, q in zip(rel, span)]
        return ChunkRef(key, start, length, version=head.version, evidence=None if proofs is None else tuple(proofs))

    async def chunks_in_shard(self, shard: tuple[int, ...], max_age: float | None = None) -> ChunkTable:
        """The non-empty innermost chunks of one shard inside the array bounds, with their
        byte ranges, in C order of their grid coordinates. Worked out once per shard version
        (cached beside the indexes), so listing many directories of one shard costs one walk.
        A corrupt shard contributes nothing (it was logged when decoded)."""
        key = self.shard_key(shard)
        head = await self._listed_head(key, max_age)
        if head is None:
            return _empty_table(self.ndim, key)
        return await self.cache.get(_chunks_key(key, head), lambda: self._chunks(key, shard, head))

    async def _listed_head(self, key: str, max_age: float | None) -> ShardIndex | LazyIndex | None:
        """`head` for a listing: None for a missing or corrupt shard (logged when decoded), or
        one that cannot be read (a FIFO, a device, a symlink leading outside, no permission:
        logged once): it costs its own files, never the listing. No room for its descriptor
        now (`TooManyOpen`) fails the listing: a listing short of every shard past the limit,
        with no error, was what an outside attacker's `ls` got."""
        try:
            return await self.head(key, max_age)
        except TooManyOpen:
            raise
        except CorruptShardError:
            return None
        except StorageError as e:
            if first_time(str(e)):
                log.warning("%s", e)
            return None

    def _listed_table(self, key: str, shard: tuple[int, ...], fixed: dict[int, int]) -> ChunkTable | None:
        """The chunk table of shard `key` (its rows with `fixed`, for a shard too large to
        tabulate) if a listing may use it without awaiting anything: its index (and table) are
        cached and the shard was checked within `LISTING_MAX_AGE`."""
        ck = ("head", key)
        if not self.cache.checked_within(ck, LISTING_MAX_AGE):
            return None
        head = self.cache.peek(ck)[1]
        if not isinstance(head, ShardIndex):
            return None
        if self._sliced_index:
            return self._index_rows(key, shard, head, fixed) if isinstance(head, ShardIndex) else None
        table = self.cache.hit(_chunks_key(key, head), None)
        return table if isinstance(table, ChunkTable) else None

    async def _chunks(self, key: str, shard: tuple[int, ...], head: ShardIndex) -> ChunkTable:
        base = np.array(shard, dtype=np.int64) * self.shard_shape
        found: list[tuple] = []
        try:
            await self._walk(key, 0, None, base, 0, head, lambda *columns: found.append(columns))
        except CorruptShardError:
            found = []
        if not found:
            return _empty_table(self.ndim, key)
        coords, offsets, lengths = found[0] if len(found) == 1 else (np.concatenate(c) for c in zip(*found))
        coords, offsets, lengths = self._inside(shard, coords, offsets, lengths)
        if self._walks_in_c_order:
            return ChunkTable(coords, offsets, lengths, key=key, version=head.version)
        return ChunkTable(*_c_sorted(coords, offsets, lengths), key=key, version=head.version)

    async def tables(self, fixed: dict[int, int]) -> list[ChunkTable]:
        """Chunk tables of the shards that can hold chunks with `fixed` grid coordinates
        (axis -> coordinate), each checked against its shard's current version within the
        last `LISTING_MAX_AGE` (a listing shows what the store holds now). A shard of more
        than `TABLE_MAX_CHUNKS` chunks gives only its rows with the `fixed` coordinates."""
        shards = await self.stored_shards(fixed)
        # tables cached and checked within the window are taken in line: a trio task per shard
        # cost 30 µs, more than the listing's own work per shard (576 tasks for the 65
        # directories of a 4096-file array), and a listing that needs nothing checked or read
        # does not pass through trio's scheduler; the rest are checked or read concurrently
        tables: list[ChunkTable | None] = [self._listed_table(self.shard_key(shard), shard, fixed) for shard in shards]
        todo = [i for i, table in enumerate(tables) if table is None]
        if todo:
            read = await gather(lambda i=i: self._shard_rows(shards[i], fixed) for i in todo)
            for i, table in zip(todo, read):
                tables[i] = table
        return tables  # type: ignore[return-value]

    async def _shard_rows(self, shard: tuple[int, ...], fixed: dict[int, int]) -> ChunkTable:
        """`_listed_table`, awaiting the shard's check and whatever must be read."""
        if not self._sliced_index and not self._walked:
            return await self.chunks_in_shard(shard, LISTING_MAX_AGE)
        key = self.shard_key(shard)
        head = await self._listed_head(key, LISTING_MAX_AGE)
        if head is None:
            return _empty_table(self.ndim, key)
        if isinstance(head, ShardIndex) and self._sliced_index:
            return self._index_rows(key, shard, head, fixed)
        parts: list[ChunkTable] = []
        await self._scan_shard(shard, fixed, lambda table, matched: parts.append(table))
        if not parts:
            return _empty_table(self.ndim, key)
        coords, offsets, lengths = (np.concatenate([getattr(t, f) for t in parts]) for f in ("coords", "offsets", "lengths"))
        return ChunkTable(*_c_sorted(coords, offsets, lengths), key=key, version=head.version)

    # -- listings, a few tables at a time

    async def scan(self, fixed: dict[int, int], visit: Visit, wanted: Wanted | None = None) -> None:
        """Every stored chunk with the `fixed` grid coordinates (axis -> coordinate), handed to
        `visit` as chunk tables, each of one shard (a shard may come in several), checked
        against the shard's current version as in `tables`. Never more is in flight than the
        tables of a few shards (about `SCAN_BYTES`) or one slice of a lazy index, so a listing
        keeps only what it takes of them (views/chunks.py), whatever the shards hold; the shards
        come from the store's listings a group at a time (`stored_shard_groups`). `wanted`: the
        shards (and directories of shards, by their leading coordinates) the listing still
        needs, asked as they come (a listing of a chunk directory's values needs no more
        shards of a value once it is known to hold a chunk)."""
        async with aclosing(self.stored_shard_groups(fixed, wanted)) as groups:
            async for shards in groups:
                await self._scan_group(shards, fixed, visit, wanted)

    async def _scan_group(self, shards: list[tuple[int, ...]], fixed: dict[int, int], visit: Visit,
                          wanted: Wanted | None) -> None:
        todo = []
        for shard in shards:  # cached and checked within the window: in line (see `tables`)
            if wanted is not None and not wanted(shard):
                continue
            key = self.shard_key(shard)
            table = self._listed_table(key, shard, fixed)
            if table is None:
                todo.append(shard)
            else:
                visit(table, self._sliced_index)
        if not todo:
            return
        level = self.plan.levels[0]
        if self._sliced_index and self.lazy(level):  # streamed: one shard, one slice at a time
            for shard in todo:
                await self._scan_shard(shard, fixed, visit)
            return
        rows = math.prod(p for a, p in enumerate(self.per_shard) if a not in fixed)
        batch = max(1, min(64, SCAN_BYTES // max(1, 8 * (self.ndim + 2) * rows)))
        for at in range(0, len(todo), batch):
            some = todo[at:at + batch] if wanted is None else [s for s in todo[at:at + batch] if wanted(s)]
            await gather(lambda shard=shard: self._scan_shard(shard, fixed, visit) for shard in some)

    async def _scan_shard(self, shard: tuple[int, ...], fixed: dict[int, int], visit: Visit) -> None:
        key = self.shard_key(shard)
        if not self._sliced_index and not self._walked:
            visit(await self.chunks_in_shard(shard, LISTING_MAX_AGE), False)
            return
        head = await self._listed_head(key, LISTING_MAX_AGE)
        if head is None:
            return
        if self._sliced_index:
            await self._scan_index(key, shard, head, fixed, visit)
            return
        base = np.array(shard, dtype=np.int64) * self.shard_shape

        def emit(coords: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
            coords, offsets, lengths = self._inside(shard, coords, offsets, lengths)
            if len(coords):
                visit(ChunkTable(coords, offsets, lengths, key=key, version=head.version), True)

        try:
            await self._walk(key, 0, None, base, 0, head, emit, fixed)  # type: ignore[arg-type]
        except CorruptShardError:
            pass  # (logged when decoded; what was listed before it stays listed)

    async def _scan_index(self, key: str, shard: tuple[int, ...], head: ShardIndex | LazyIndex, fixed: dict[int, int],
                          visit: Visit) -> None:
        """The stored chunks of one shard (one index level) with the `fixed` coordinates,
        `LIST_SLICE` index entries at a time: only the span of the index that holds them is
        read (one contiguous run where the fixed axes lead the index's order), a lazy index in
        slices decoded in worker threads (other requests go on meanwhile)."""
        level = self.plan.levels[0]
        strides = [math.prod(level.grid[j + 1:]) for j in range(len(level.grid))]
        lo, free, checks = 0, 0, []
        for j, (a, g) in enumerate(zip(level.perm, level.grid)):
            if a in fixed:
                v = fixed[a] - shard[a] * g
                if not 0 <= v < g:
                    return
                lo += v * strides[j]
                checks.append((strides[j], g, v))
            else:
                free += (g - 1) * strides[j]
        hi = lo + free + 1
        if hi - lo == math.prod(g for a, g in zip(level.perm, level.grid) if a not in fixed):
            checks = []  # the span holds nothing else (the fixed axes lead the index's order)
        step = LIST_SLICE if isinstance(head, ShardIndex) else self._list_slice
        for first in range(lo, hi, step):
            count = min(step, hi - first)
            if isinstance(head, ShardIndex):
                part = self._slice_rows(head.entries[first:first + count], first, shard, checks)
                await trio.lowlevel.checkpoint()
            else:
                raw = await self.store.read(key, head.at + 16 * first, 16 * count, expect=head.version)
                if raw is None or len(raw) != 16 * count:
                    log.warning("%s: shard index is truncated (listing stops there)", key)
                    return
                part = await decode_step(lambda data, first=first: self._slice_rows(head.decode(data), first, shard, checks), raw)
            if part is not None:
                visit(ChunkTable(*part, key=key, version=head.version), True)

    def _slice_rows(self, flat: np.ndarray, first: int, shard: tuple[int, ...], checks: list) -> tuple | None:
        """(coords, offsets, lengths) of the stored chunks in entries `flat` of a level-0
        index, the first of them entry `first`, that pass `checks` ((stride, size, value) per
        fixed index axis) and lie inside the array."""
        present = _stored(flat)
        if checks and len(present):
            lin = present + first
            keep = np.ones(len(present), bool)
            for stride, g, v in checks:
                keep &= (lin // stride) % g == v
            present = present[keep]
        if not len(present):
            return None
        level = self.plan.levels[0]
        coords = np.empty((len(present), self.ndim), dtype=np.int64)
        if self.ndim:
            for a, g, pos in zip(level.perm, level.grid, np.unravel_index(present + first, level.grid)):
                coords[:, a] = pos + shard[a] * g
        coords, offsets, lengths = self._inside(shard, coords, flat[present, 0], flat[present, 1])
        return (coords, offsets, lengths) if len(coords) else None

    def _index_rows(self, key: str, shard: tuple[int, ...], head: ShardIndex, fixed: dict[int, int]) -> ChunkTable:
        """The stored chunks of one shard with the `fixed` coordinates, straight from its
        (one-level) index: the index is a dense array over the shard's chunk grid, so fixing
        axes is slicing it, and a directory costs its own entries, not its shard's."""
        level = self.plan.levels[0]
        entries = head.entries.reshape(*level.grid, 2)
        free = [j for j, a in enumerate(level.perm) if a not in fixed]
        sub = entries[tuple(slice(None) if a not in fixed else fixed[a] - shard[a] * g
                            for a, g in zip(level.perm, level.grid))]
        flat = sub.reshape(-1, 2)
        present = _stored(flat)
        coords = np.empty((len(present), self.ndim), dtype=np.int64)
        for a, value in fixed.items():
            coords[:, a] = value
        for j, pos in zip(free, np.unravel_index(present, sub.shape[:-1]) if free else ()):
            a = level.perm[j]
            coords[:, a] = pos + shard[a] * level.grid[j]
        offsets, lengths = flat[present, 0], flat[present, 1]
        coords, offsets, lengths = self._inside(shard, coords, offsets, lengths)
        in_order = all(level.perm[i] < level.perm[j] for i, j in zip(free, free[1:]))
        columns = (coords, offsets, lengths) if in_order else _c_sorted(coords, offsets, lengths)
        return ChunkTable(*columns, key=key, version=head.version)

    def _inside(self, shard: tuple[int, ...], coords: np.ndarray, *columns: np.ndarray) -> tuple:
        """The rows inside the array's bounds (only an edge shard has others)."""
        if all((s + 1) * p <= g for s, p, g in zip(shard, self.per_shard, self.grid)):
            return (coords, *columns)
        keep = np.all(coords < np.array(self.grid, dtype=np.int64), axis=1)
        return (coords[keep], *(c[keep] for c in columns))

    async def _walk(self, key: str, start: int, length: int | None, base: np.ndarray, depth: int, head: ShardIndex,
                    emit: Callable[[np.ndarray, np.ndarray, np.ndarray], None], fixed: dict[int, int] | None = None) -> None:
        """`emit(grid coords, absolute offsets, lengths)` of the innermost chunks below one
        index, one innermost index at a time; with `fixed`, only of chunks with those grid
        coordinates (inner shards that cannot hold one are not read)."""
        level = self.plan.levels[depth]
        idx = head if depth == 0 else await self.index(key, start, length, depth, head)
        if idx is None:
            return
        if isinstance(idx, LazyIndex):  # (nested sharding with an index too large to hold)
            message = f"{key}: a nested index of {level.index_nbytes} bytes is too large to list (chunks open by name)"
            if first_time(message):
                log.warning("%s", message)
            return
        present = idx.present()
        if self.ndim:
            local_level = np.stack(np.unravel_index(present, level.grid), axis=1)
        else:
            local_level = np.zeros((len(present), 0), dtype=np.int64)
        local = np.empty_like(local_level)
        local[:, list(level.perm)] = local_level
        elem = base + local * np.array(level.inner_shape, dtype=np.int64)
        entries = idx.entries[present]
        if fixed:
            keep = np.ones(len(elem), bool)
            for a, v in fixed.items():
                first = elem[:, a] // self.chunk_shape[a]
                keep &= (first <= v) & (v < first + level.inner_shape[a] // self.chunk_shape[a])
            elem, entries = elem[keep], entries[keep]
        if depth == len(self.plan.levels) - 1:
            if len(elem):
                emit(elem // self.chunk_shape, entries[:, 0] + np.uint64(start), entries[:, 1])
            return
        for row, (off, nb) in zip(elem, entries.tolist()):
            try:
                await self._walk(key, start + off, nb, row, depth + 1, head, emit, fixed)
            except CorruptShardError:
                continue

    def _shard_ranges(self, fixed: dict[int, int]) -> list[range]:
        return [range(fixed[a] // p, fixed[a] // p + 1) if a in fixed else range(g)
                for a, (p, g) in enumerate(zip(self.per_shard, self.shard_grid))]

    def shards(self, fixed: dict[int, int] | None = None) -> Iterator[tuple[int, ...]]:
        """Shard coordinates that can hold chunks with the `fixed` grid coordinates (axis ->
        coordinate); all shards when nothing is fixed."""
        return itertools.product(*self._shard_ranges(fixed or {}))

    async def stored_shards(self, fixed: dict[int, int] | None = None) -> list[tuple[int, ...]]:
        """Like `shards`, but for grids too large to enumerate only the shards the store lists
        (directory listings proportional to what is stored, not to the grid), sorted."""
        found: list[tuple[int, ...]] = []
        async with aclosing(self.stored_shard_groups(fixed)) as groups:
            async for group in groups:
                found.extend(group)
        return sorted(found)

    async def stored_shard_groups(self, fixed: dict[int, int] | None = None,
                                  wanted: Wanted | None = None) -> AsyncIterator[list[tuple[int, ...]]]:
        """`stored_shards` a group at a time, in no set order, as the store's listings find
        them: a listing that stops early (past its budget) has listed only the directories it
        needed, and what is held at once is the listings of `LIST_DIRS_AT_ONCE` directories
        and a compact list of the ones still to list. (An array of 100,000 row directories,
        one shard each, was listed whole, one directory after another, before its first shard
        was read: 78 s and 124-185 MiB under memory=64M to a listing too large for the budget;
        500,000: 6.5 min and 336 MiB, other reads waiting meanwhile.)"""
        ranges = self._shard_ranges(fixed or {})
        if math.prod(len(r) for r in ranges) <= ENUMERATE_SHARDS:
            yield list(itertools.product(*ranges))
            return
        enc = self.node.encoding
        top = ["c"] if enc.name == "default" else []
        if enc.separator == ".":  # every shard key is a name in the array directory
            entries = await self.store.list(self.node.path)
            if entries is None:
                self._unlistable(ranges)
                return
            group = []
            for e in entries:
                parts = e.name.split(".")
                if parts[: len(top)] != top or e.is_dir:
                    continue
                coords = _coords(parts[len(top):], ranges)
                if coords is not None and enc.key(coords) == e.name:
                    group.append(coords)
                    if len(group) == SHARDS_AT_ONCE:
                        yield group
                        group = []
            if group:
                yield group
            return
        # nested: one directory level per axis, depth first; fixed axes are followed without a
        # listing. Each item to do is a parent directory and values of the next axis under it
        last = len(ranges) - 1
        todo: list[tuple[int, str, tuple[int, ...], np.ndarray | None]] = [(0, "/".join([self.node.path, *top]).strip("/"), (), None)]
        while todo:
            axis, key, coords, values = todo.pop()
            dirs = [(key, coords)] if values is None else [(_child(key, v), (*coords, v)) for v in values.tolist()]
            while len(ranges[axis]) == 1 and axis < last:
                v = ranges[axis].start
                dirs = [(_child(k, v), (*c, v)) for k, c in dirs]
                axis += 1
            if wanted is not None and axis:
                dirs = [(k, c) for k, c in dirs if wanted(c)]
                if not dirs:
                    continue
            listed = await gather(lambda k=k: self.store.list(k) for k, _ in dirs)
            if axis == 0 and listed[0] is None:
                self._unlistable(ranges)
                return
            if axis == last:
                group = [(*c, v) for (_, c), entries in zip(dirs, listed) for v in _values_in(entries, ranges[axis], False).tolist()]
                for at in range(0, len(group), SHARDS_AT_ONCE):
                    yield group[at:at + SHARDS_AT_ONCE]
                continue
            more = []
            for (k, c), entries in zip(dirs, listed):
                values = _values_in(entries, ranges[axis], True)
                more.extend((axis + 1, k, c, values[at:at + LIST_DIRS_AT_ONCE]) for at in range(0, len(values), LIST_DIRS_AT_ONCE))
            todo.extend(reversed(more))

    def _unlistable(self, ranges: list[range]) -> None:
        log.warning("%s: %d shard positions and the store cannot list them: the listing shows none",
                    self.node.path or "/", math.prod(len(r) for r in ranges))


def _child(key: str, value: int) -> str:
    return f"{key}/{value}" if key else str(value)


def _values_in(entries, r: range, dirs: bool) -> np.ndarray:
    """The coordinates in `r` that a listing (None: none) names as directories or files (as
    int64: a list of 500,000 ints took 17 MiB besides the listing itself)."""
    if entries is None:
        return np.zeros(0, np.int64)
    pairs = zip(entries.names, entries.is_dir) if isinstance(entries, Entries) else ((e.name, e.is_dir) for e in entries)
    found = (parse_coord(name) for name, is_dir in pairs if bool(is_dir) == dirs)
    return np.fromiter((c for c in found if c is not None and c in r), np.int64)


def parse_coord(name: str) -> int | None:
    """A canonical non-negative decimal ("0", "17"; not "017", "+1", "1 ")."""
    if not name.isascii() or not name.isdigit() or (len(name) > 1 and name[0] == "0"):
        return None
    return int(name)


def _coords(parts: list[str], ranges: list[range]) -> tuple[int, ...] | None:
    coords = tuple(parse_coord(p) for p in parts)
    if len(coords) != len(ranges) or any(c is None or c not in r for c, r in zip(coords, ranges)):
        return None
    return coords  # type: ignore[return-value]


class PlainArray:
    """An unsharded array seen through the same interface as ShardedArray (grid, locate,
    tables), for views that rename its chunks (N5, Zarr v2). Its chunk keys are listed once."""

    def __init__(self, node: ArrayNode, store: Store):
        self.node = node
        self.store = store
        self.ndim = len(node.shape)
        self.chunk_shape = node.chunk_shape
        self.grid = tuple(-(-s // c) for s, c in zip(node.shape, node.chunk_shape))
        self._table: ChunkTable | None = None

    def in_grid(self, coords: tuple[int, ...]) -> bool:
        return len(coords) == self.ndim and all(0 <= c < g for c, g in zip(coords, self.grid))

    def row_dir(self, prefix: tuple[int, ...]) -> str | None:
        return self.node.row_dir(prefix)

    async def locate(self, coords: tuple[int, ...]) -> ChunkRef | None:
        if not self.in_grid(coords):
            return None
        key = self.node.store_key(self.node.encoding.key(coords))
        size = await self.store.size(key)
        return None if size is None else ChunkRef(key, 0, size)

    async def tables(self, fixed: dict[int, int]) -> list[ChunkTable]:
        if self._table is None:
            self._table = await self._list()
        return [self._table]

    async def _list(self) -> ChunkTable:
        enc, found = self.node.encoding, []
        todo = [""]
        while todo:
            rel = todo.pop()
            for e in await self.store.list(self.node.store_key(rel).rstrip("/")) or []:
                name = f"{rel}/{e.name}" if rel else e.name
                if e.is_dir:
                    todo.append(name)
                    continue
                parts = name.split(enc.separator)
                if enc.name == "default":
                    if parts[0] != "c":
                        continue
                    parts = parts[1:]
                elif self.ndim == 0:
                    parts = [] if parts == ["0"] else ["x"]
                if len(parts) == self.ndim and all(p.isdigit() for p in parts):
                    coords = tuple(int(p) for p in parts)
                    if self.in_grid(coords) and enc.key(coords) == name:
                        found.append((coords, self.node.store_key(name), e.size))
        if not found:
            return _empty_table(self.ndim)
        found.sort()
        sizes = [s if s is not None else await self.store.size(k) or 0 for _, k, s in found]
        coords = np.array([c for c, _, _ in found], dtype=np.int64).reshape(len(found), self.ndim)
        return ChunkTable(coords, np.zeros(len(found), np.uint64), np.array(sizes, np.uint64), keys=[k for _, k, _ in found])


# --------------------------------------------------------------------------- the array model


def array_model(node: ArrayNode, store: Store, cache: CoalescingCache) -> ArrayModel:
    """The array as every view sees it: innermost chunks, their codecs, where they are."""
    meta = node.meta
    names = meta.get("dimension_names")
    warning = node.warning or ("storage transformers" if meta.get("storage_transformers") else None)
    return ArrayModel(
        path=node.path, shape=node.shape, data_type=meta["data_type"],
        chunk_shape=node.plan.chunk_shape if node.plan else node.chunk_shape,
        codecs=node.plan.codecs if node.plan else meta["codecs"], fill_value=meta.get("fill_value"),
        chunks=ShardedArray(node, store, cache) if node.plan else PlainArray(node, store),
        dimension_names=tuple(names) if isinstance(names, list) and names else None,
        attributes=meta.get("attributes") or {}, separator=node.encoding.separator,
        chunk_dir="c" if node.encoding.name == "default" and node.encoding.separator == "/" and node.shape else "",
        version=node.version, meta_key=child_path(node.path, META), warning=warning)


def hierarchy_model(nodes: dict[str, ArrayNode | GroupNode], store: Store, cache: CoalescingCache) -> Hierarchy:
    return {path: array_model(n, store, cache) if isinstance(n, ArrayNode)
            else GroupModel(path, n.meta.get("attributes") or {}, list(n.children), n.version, child_path(path, META))
            for path, n in nodes.items()}
