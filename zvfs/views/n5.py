"""The N5 view of a Zarr v3 hierarchy: datasets with `attributes.json`, blocks at `0/4/1/7`
(grid coordinates in reversed axis order), in the N5 block format (big-endian header, then
the data, big-endian, compressed).

Bytes pass through behind the header where the chunk data already is what N5 wants
(big-endian or one-byte values, no transpose, at most one of gzip/zstd/blosc); such blocks keep
the full chunk size at the array end, which N5 allows. Otherwise blocks are transcoded:
decoded, cropped at the array end, byte-swapped, encoded with `n5_compression` (raw by
default, so their sizes are known without decoding). N5 has no fill value: an array whose fill
value is not zero gets a fill block for every chunk that is not stored.
"""

from __future__ import annotations

import itertools
import json
import math
import struct

import numpy as np

from ..formats.chunkref import ChunkRef
from ..formats.codecs import BLOSC_SHUFFLE, Chain, compressor, config_of, name_of
from ..formats.zarr3 import ArrayNode, ChunkTable, GroupNode
from ..tree import File
from .chunks import Layout, MakeFile
from .hierarchy import HierarchyView, NotExpressible
from .zarr2 import leaf_chunks, leaf_codecs

N5_VERSION = "2.0.0"  # older Java readers refuse newer versions than theirs
DATA_TYPES = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"}
DATASET_KEYS = ("dimensions", "blockSize", "dataType", "compression", "axes")
FILL_KEY = ""  # ChunkRef.key of a chunk that is not stored (a fill block)


def n5_compression(codec) -> dict:
    name, conf = name_of(codec), config_of(codec)
    if name == "gzip":
        return {"type": "gzip", "level": conf.get("level", 5), "useZlib": False}
    if name == "zstd":
        return {"type": "zstd", "level": conf.get("level", 0)}
    if name == "blosc":
        shuffle = conf.get("shuffle", "noshuffle")
        # no "nthreads": tensorstore refuses it, and N5's Java reader defaults it
        return {"type": "blosc", "cname": conf.get("cname", "lz4"), "clevel": conf.get("clevel", 5),
                "shuffle": BLOSC_SHUFFLE.get(shuffle, shuffle), "blocksize": conf.get("blocksize", 0)}
    return {"type": "raw"}


def block_header(dims_array_order) -> bytes:
    dims = list(reversed([int(d) for d in dims_array_order]))
    return struct.pack(f">HH{len(dims)}I", 0, len(dims), *dims)


class ArraySpec:
    """What every block of one dataset needs to know."""

    def __init__(self, node: ArrayNode, chain: Chain, output_codec):
        self.node = node
        self.chain = chain
        self.data_type = node.meta["data_type"]
        self.dtype_be = np.dtype(self.data_type).newbyteorder(">")
        self.chunk = leaf_chunks(node)
        self.shape = node.shape
        ndim = len(node.shape)
        self.passthrough = (chain.order in (None, tuple(range(ndim))) and chain.endian in ("|", ">")
                            and len(chain.compressors) <= 1)
        self.codec = (chain.compressors[0] if chain.compressors else None) if self.passthrough else output_codec
        fill = node.meta.get("fill_value", 0)
        self.fill = np.array(float(fill) if isinstance(fill, str) else fill, dtype=self.dtype_be)
        self.needs_fill = bool(np.any(self.fill.reshape(1).view(np.uint8)))  # N5 reads missing blocks as zero bytes

    def cropped(self, coords) -> tuple[int, ...]:
        return tuple(min(c, s - i * c) for c, s, i in zip(self.chunk, self.shape, coords))

    def encode(self, arr: np.ndarray) -> bytes:
        data = np.ascontiguousarray(arr, dtype=self.dtype_be).tobytes()
        return data if self.codec is None else bytes(compressor(self.codec).encode(data))


class FilledSource:
    """A chunk source where every grid position exists: chunks not stored are fill blocks."""

    def __init__(self, inner):
        self.inner = inner
        self.grid = inner.grid
        self.ndim = inner.ndim

    def in_grid(self, coords) -> bool:
        return self.inner.in_grid(coords)

    async def locate(self, coords) -> ChunkRef | None:
        if not self.in_grid(coords):
            return None
        return await self.inner.locate(coords) or ChunkRef(FILL_KEY, 0, 0)

    async def tables(self, fixed: dict[int, int]) -> list[ChunkTable]:
        stored = await self.inner.tables(fixed)
        axes = [[fixed[a]] if a in fixed else range(g) for a, g in enumerate(self.grid)]
        every = np.array(list(itertools.product(*axes)), dtype=np.int64).reshape(-1, self.ndim)
        have = np.concatenate([t.coords for t in stored]) if stored else np.zeros((0, self.ndim), np.int64)
        if self.ndim:
            missing = every[~np.isin(np.ravel_multi_index(every.T, self.grid), np.ravel_multi_index(have.T, self.grid))]
        else:
            missing = every[:0] if len(have) else every
        fill = ChunkTable(missing, np.zeros(len(missing), np.uint64), np.zeros(len(missing), np.uint64), key=FILL_KEY)
        return [*stored, fill]


class N5Block(File):
    __slots__ = ("view", "spec", "ref", "coords")

    def __init__(self, ino: int, view: "N5View", spec: ArraySpec, ref: ChunkRef, coords: tuple[int, ...]):
        super().__init__(ino)
        self.view = view
        self.spec = spec
        self.ref = ref
        self.coords = coords

    @property
    def _direct(self) -> bool:
        """Header + the stored bytes, read by range."""
        return self.spec.passthrough and self.ref.key != FILL_KEY

    def known_size(self) -> int | None:
        spec = self.spec
        if self._direct:
            return len(block_header(spec.chunk)) + self.ref.length
        if spec.codec is None and not spec.passthrough:
            dims = spec.cropped(self.coords)
            return len(block_header(dims)) + math.prod(dims) * spec.dtype_be.itemsize
        return None

    async def size(self) -> int:
        size = self.known_size()
        return size if size is not None else len(await self._block())

    async def _block(self) -> bytes:
        """The whole block, built (transcoded or filled) and kept in the decoded cache."""
        spec = self.spec

        async def build() -> bytes:
            if self.ref.key == FILL_KEY:
                dims = spec.chunk if spec.passthrough else spec.cropped(self.coords)
                return block_header(dims) + spec.encode(np.broadcast_to(spec.fill, dims))
            raw = await self.view.store.read(self.ref.key, self.ref.offset, self.ref.length)
            arr = spec.chain.decode(raw, spec.data_type, spec.chunk)
            dims = spec.cropped(self.coords)
            return block_header(dims) + spec.encode(arr[tuple(slice(0, d) for d in dims)])

        key = ("n5", spec.node.path, self.coords)
        return await self.view.decoded.get(key, build)

    async def read(self, offset: int, size: int) -> bytes:
        if not self._direct:
            return (await self._block())[offset:offset + size]
        header = block_header(self.spec.chunk)
        out = header[offset:offset + size]
        start = max(0, offset - len(header))
        want = min(size - len(out), self.ref.length - start)
        if want > 0:
            data = await self.view.store.read(self.ref.key, self.ref.offset + start, want, extent=self.ref.offset + self.ref.length)
            out += data or b""
        return out


class N5View(HierarchyView):
    name = "n5"

    def __init__(self, store, nodes, cache, decoded, compression: str = "raw"):
        self.output_codec = None if compression == "raw" else {"name": compression, "configuration": {}}
        self.specs: dict[str, ArraySpec] = {}
        super().__init__(store, nodes, cache, decoded)

    def check(self, node: ArrayNode) -> None:
        if node.warning:
            raise NotExpressible(node.warning)
        if not node.shape:
            raise NotExpressible("0-d arrays have no N5 form")
        if node.meta["data_type"] not in DATA_TYPES:
            raise NotExpressible(f"data type {node.meta['data_type']!r} has no N5 equivalent")
        if node.meta.get("storage_transformers"):
            raise NotExpressible("storage transformers")
        chain = Chain.parse(leaf_codecs(node), node.meta["data_type"], len(node.shape))
        if chain is None or chain.serializer != "bytes":
            raise NotExpressible(f"codecs {[name_of(c) for c in leaf_codecs(node)]} cannot be decoded here")
        self.specs[node.path] = ArraySpec(node, chain, self.output_codec)

    def source(self, node: ArrayNode):
        inner = super().source(node)
        return FilledSource(inner) if self.specs[node.path].needs_fill else inner

    def _attributes(self, meta: dict, own: dict, path: str) -> bytes:
        user = {k: v for k, v in (meta.get("attributes") or {}).items() if k not in own and k not in DATASET_KEYS and k != "n5"}
        root = {"n5": N5_VERSION} if path == "" else {}
        return json.dumps({**root, **user, **own}, indent=2).encode()

    def group_files(self, group: GroupNode) -> dict[str, bytes]:
        return {"attributes.json": self._attributes(group.meta, {}, group.path)}

    def array_files(self, node: ArrayNode) -> dict[str, bytes]:
        spec = self.specs[node.path]
        own = {
            "dimensions": list(reversed(node.shape)),
            "blockSize": list(reversed(spec.chunk)),
            "dataType": node.meta["data_type"],
            "compression": n5_compression(spec.codec) if spec.codec else {"type": "raw"},
        }
        names = node.meta.get("dimension_names")
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            own["axes"] = list(reversed(names))
        return {"attributes.json": self._attributes(node.meta, own, node.path)}

    def layout(self, node: ArrayNode) -> Layout:
        return Layout.n5(len(node.shape))

    def make_file(self, node: ArrayNode, source) -> MakeFile:
        spec = self.specs[node.path]
        return lambda ino, ref, coords: N5Block(ino, self, spec, ref, coords)

