"""The N5 view of a Zarr v3 hierarchy: datasets with `attributes.json`, blocks at `0/4/1/7`
(grid coordinates in reversed axis order), in the N5 block format (big-endian header, then
the data, big-endian, compressed).

Bytes pass through behind the header where the chunk data already is what N5 wants
(big-endian or one-byte values, no transpose, at most one of gzip/zstd/blosc); such blocks keep
the full chunk size at the array end, which N5 allows. Otherwise blocks are transcoded:
decoded by zarr's codecs (formats/codecs.py: any chain zarr decodes, with output limits),
cropped at the array end, byte-swapped, encoded with `n5_compression` (raw by default, so
their sizes are known without decoding). Both paths read the chunk through `RangeFile`, so
they get the same length and version checks as the Zarr views' chunk files.

N5 has no fill value: in an array whose fill value is not zero, a chunk that is not stored is
a fill block. Fill blocks are found by name (a lookup of any grid position) but listings show
only the stored chunks: listing them would mean building every grid position (a 10^6-chunk
grid is 10^6 entries for a handful of stored chunks).

OME-Zarr multiscale images carry the N5 multiscale conventions (views/ome.py); their levels
are named s0, s1, ... as those tools require.
"""

from __future__ import annotations

import json
import logging
import math
import struct

import numpy as np

from ..errors import CorruptShardError
from ..formats.chunkref import ChunkRef
from ..formats.codecs import BLOSC_SHUFFLE, COMPRESSORS, Chain, DecodeError, compressor, config_of, fill_value, name_of
from ..formats.zarr3 import ArrayNode, ChunkTable, GroupNode, child_path
from ..tree import File, RangeFile
from .chunks import Layout, MakeFile
from .hierarchy import HierarchyView, NotExpressible
from .ome import N5Multiscale
from .zarr2 import leaf_chunks, leaf_codecs

log = logging.getLogger("zvfs.view")

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
        self.passthrough = (chain.serializer == "bytes" and not chain.array_codecs and chain.endian in ("|", ">")
                            and len(chain.compressors) <= 1 and all(name_of(c) in COMPRESSORS for c in chain.compressors))
        self.codec = (chain.compressors[0] if chain.compressors else None) if self.passthrough else output_codec
        self.fill = np.array(fill_value(self.data_type, node.meta.get("fill_value", 0)), dtype=self.dtype_be)
        self.needs_fill = bool(np.any(self.fill.reshape(1).view(np.uint8)))  # N5 reads missing blocks as zero bytes

    def cropped(self, coords) -> tuple[int, ...]:
        return tuple(min(c, s - i * c) for c, s, i in zip(self.chunk, self.shape, coords))

    def encode(self, arr: np.ndarray) -> bytes:
        data = np.ascontiguousarray(arr, dtype=self.dtype_be).tobytes()
        return data if self.codec is None else bytes(compressor(self.codec).encode(data))


class FilledSource:
    """A chunk source where every grid position exists: a chunk not stored is a fill block.
    Listings (tables) show the stored chunks only; see the module docstring."""

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
        return await self.inner.tables(fixed)


class N5Block(File):
    __slots__ = ("view", "spec", "data", "coords")

    def __init__(self, ino: int, view: "N5View", spec: ArraySpec, ref: ChunkRef, coords: tuple[int, ...]):
        super().__init__(ino)
        self.view = view
        self.spec = spec
        self.data = None if ref.key == FILL_KEY else RangeFile(ino, view.store, ref)  # the stored chunk
        self.coords = coords

    @property
    def _direct(self) -> bool:
        """Header + the stored bytes, read by range."""
        return self.spec.passthrough and self.data is not None

    def known_size(self) -> int | None:
        spec = self.spec
        if self._direct:
            return len(block_header(spec.chunk)) + self.data.ref.length
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
            if self.data is None:
                dims = spec.chunk if spec.passthrough else spec.cropped(self.coords)
                return block_header(dims) + spec.encode(np.broadcast_to(spec.fill, dims))
            ref = self.data.ref
            raw = await self.data.read(0, ref.length)
            try:
                arr = spec.chain.decode(raw, spec.data_type, spec.chunk)
            except DecodeError as e:
                err = CorruptShardError(ref.key, f"chunk {list(self.coords)} of {spec.node.path or '/'}: {e}")
                log.warning("%s", err)
                raise err from None
            dims = spec.cropped(self.coords)
            return block_header(dims) + spec.encode(arr[tuple(slice(0, d) for d in dims)])

        key = ("n5", spec.node.path, self.coords)
        return await self.view.decoded.get(key, build)

    async def read(self, offset: int, size: int) -> bytes:
        if not self._direct:
            return (await self._block())[offset:offset + size]
        header = block_header(self.spec.chunk)
        out = header[offset:offset + size]
        if size > len(out):
            out += await self.data.read(max(0, offset - len(header)), size - len(out))
        return out


class N5View(HierarchyView):
    name = "n5"

    def __init__(self, store, nodes, cache, decoded, compression: str = "raw"):
        self.output_codec = None if compression == "raw" else {"name": compression, "configuration": {}}
        self.specs: dict[str, ArraySpec] = {}
        self.multiscales: dict[str, N5Multiscale] = {}  # image group path -> its N5 conventions
        self.levels: dict[str, tuple[N5Multiscale, str]] = {}  # level array path -> (its image, path in it)
        for path, node in nodes.items():
            if isinstance(node, GroupNode):
                is_array = lambda p, g=path: isinstance(nodes.get(child_path(g, p)), ArrayNode)  # noqa: E731
                ms = N5Multiscale.from_attributes(node.meta.get("attributes") or {}, is_array)
                if ms is not None:
                    self.multiscales[path] = ms
                    self.levels.update({child_path(path, p): (ms, p) for p in ms.levels})
        self.nodes = nodes
        for path, ms in self.multiscales.items():
            if set(self._shown_children(nodes[path])) & set(ms.names):  # a child already has a level's name
                ms.names = {}
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
        if chain is None:
            raise NotExpressible(f"codecs {[name_of(c) for c in leaf_codecs(node)]} cannot be decoded by zarr")
        try:
            self.specs[node.path] = ArraySpec(node, chain, self.output_codec)
        except (ValueError, TypeError) as e:
            raise NotExpressible(f"fill value {node.meta.get('fill_value')!r}: {e}") from None

    def child_names(self, group: GroupNode) -> dict[str, str]:
        """In an OME image group the levels are s0, s1, ... (what N5 multiscale readers open);
        children that hold nothing but levels (ngff-zarr's `scale0/` groups) are not shown
        again under their stored names."""
        ms = self.multiscales.get(group.path)
        if ms is None or not ms.names:
            return super().child_names(group)
        return {**{n: n for n in self._shown_children(group)}, **ms.names}

    def _shown_children(self, group: GroupNode) -> list[str]:
        levels = {child_path(group.path, p) for p in self.multiscales[group.path].levels}
        return [n for n in group.children if not self._only_levels(child_path(group.path, n), levels)]

    def _only_levels(self, path: str, levels: set[str]) -> bool:
        """Whether everything under `path` is one of the image's levels."""
        node = self.nodes.get(path)
        if isinstance(node, ArrayNode):
            return path in levels
        return isinstance(node, GroupNode) and all(self._only_levels(child_path(path, c), levels) for c in node.children)

    def source(self, node: ArrayNode):
        inner = super().source(node)
        return FilledSource(inner) if self.specs[node.path].needs_fill else inner

    def _attributes(self, attrs: dict, own: dict, path: str) -> bytes:
        user = {k: v for k, v in attrs.items() if k not in own and k not in DATASET_KEYS and k != "n5"}
        root = {"n5": N5_VERSION} if path == "" else {}
        return json.dumps({**root, **user, **own}, indent=2).encode()

    def group_files(self, group: GroupNode) -> dict[str, bytes]:
        attrs = group.meta.get("attributes") or {}
        ms = self.multiscales.get(group.path)
        if ms is not None:
            return {"attributes.json": self._attributes(ms.ome_attributes(attrs), ms.group_attributes(), group.path)}
        return {"attributes.json": self._attributes(attrs, {}, group.path)}

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
        if node.path in self.levels:
            ms, level = self.levels[node.path]
            own.update(ms.level_attributes(level))
        return {"attributes.json": self._attributes(node.meta.get("attributes") or {}, own, node.path)}

    def layout(self, node: ArrayNode) -> Layout:
        return Layout.n5(len(node.shape))

    def make_file(self, node: ArrayNode, source) -> MakeFile:
        spec = self.specs[node.path]
        return lambda ino, ref, coords: N5Block(ino, self, spec, ref, coords)
