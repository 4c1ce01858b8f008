"""The N5 view of an array model hierarchy (Zarr v3, ZVF, precomputed volume scales):
datasets with `attributes.json`, blocks at `0/4/1/7`, in the N5 block format (big-endian
header, then the data, big-endian, compressed).

N5 lists dimensions fastest-varying first. For a model whose chunk bytes are C-ordered (a
Zarr array without transpose) that is the reversed axis order, as every N5 writer of Zarr
data has it; for a Fortran-ordered model (a fully reversing transpose: precomputed volumes,
whose index order is x, y, z, channel) it is the model's own order, so tensorstore's `n5`
driver reads a precomputed scale in the same index order as its `neuroglancer_precomputed`
driver. Block paths list grid coordinates in the same order as `dimensions`.

Bytes pass through behind the header where the chunk data already is what N5 wants
(big-endian or one-byte values, in N5's order, at most one of gzip/zstd/blosc); such blocks
keep their stored extent at the array end (full for Zarr, cropped for precomputed: N5 allows
both). Otherwise blocks are transcoded (views/transcode.py): decoded by zarr's codecs
(formats/codecs.py: any chain zarr decodes, with output limits), cropped at the array end,
byte-swapped, encoded with `n5_compression` (raw by default, so their sizes are known
without decoding).

N5 has no fill value: in an array whose fill value is not zero, a chunk that is not stored is
a fill block. Fill blocks are found by name (a lookup of any grid position) but listings show
only the stored chunks: listing them would mean building every grid position (a 10^6-chunk
grid is 10^6 entries for a handful of stored chunks).

OME-Zarr multiscale images carry the N5 multiscale conventions (views/ome.py); their levels
are named s0, s1, ... as those tools require.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ..formats.array import ArrayModel, ChunkSource, ChunkTableLike, GroupModel
from ..formats.chunkref import ChunkRef
from ..formats.codecs import BLOSC_SHUFFLE, Chain, config_of, name_of
from ..formats.zarr3 import child_path
from .chunks import Layout
from .hierarchy import HierarchyView, NotExpressible
from .ome import N5Multiscale
from .transcode import FILL_KEY, Encoding, simple
from .zarr2 import dimension_names

N5_VERSION = "2.0.0"  # older Java readers refuse newer versions than theirs
DATA_TYPES = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"}
DATASET_KEYS = ("dimensions", "blockSize", "dataType", "compression", "axes")


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


#: dataset attributes that tensorstore's n5 driver reads as one entry per dimension (its
#: dimension units), refusing the dataset when the length differs, and their padding
PER_DIMENSION = {"resolution": 1, "units": ""}


def per_dimension(attrs: dict, ndim: int) -> dict:
    """`attrs` with shorter per-dimension lists padded to `ndim` entries (a precomputed scale's
    x, y, z `resolution` on its x, y, z, channel array: the channel gets 1)."""
    out = dict(attrs)
    for key, pad in PER_DIMENSION.items():
        value = out.get(key)
        if isinstance(value, list) and len(value) < ndim:
            out[key] = value + [pad] * (ndim - len(value))
    return out


def n5_axes(chain: Chain, ndim: int) -> tuple[int, ...]:
    """The model axes in N5's order (fastest-varying first), see the module docstring."""
    fortran = ndim > 1 and chain.order == tuple(reversed(range(ndim)))
    return tuple(range(ndim)) if fortran else tuple(reversed(range(ndim)))


def n5_encoding(node: ArrayModel, chain: Chain, output_codec) -> Encoding:
    axes = n5_axes(chain, node.ndim)
    perm = tuple(reversed(axes))  # the C order of N5's bytes
    order = chain.order if chain.order is not None else (perm if chain.array_codecs else tuple(range(node.ndim)))
    passthrough = simple(chain) and chain.endian in ("|", ">") and order == perm

    def header(extent: tuple[int, ...]) -> bytes:
        return struct.pack(f">HH{len(axes)}I", 0, len(axes), *(extent[a] for a in axes))

    codec = (chain.compressors[0] if chain.compressors else None) if passthrough else output_codec
    return Encoding("n5", node, chain, perm, np.dtype(node.data_type).newbyteorder(">"), codec, passthrough,
                    full_edges=False, header=header)


class FilledSource:
    """A chunk source where every grid position exists: a chunk not stored is a fill block.
    Listings (tables) show the stored chunks only; see the module docstring."""

    def __init__(self, inner: ChunkSource):
        self.inner = inner
        self.grid = inner.grid
        self.ndim = inner.ndim

    def in_grid(self, coords) -> bool:
        return self.inner.in_grid(coords)

    async def locate(self, coords) -> ChunkRef | None:
        if not self.in_grid(coords):
            return None
        return await self.inner.locate(coords) or ChunkRef(FILL_KEY, 0, 0)

    async def tables(self, fixed: dict[int, int]) -> list[ChunkTableLike]:
        return await self.inner.tables(fixed)


class N5View(HierarchyView):
    name = "n5"

    def __init__(self, store, nodes, decoded, listings=None, compression: str = "raw"):
        self.output_codec = None if compression == "raw" else {"name": compression, "configuration": {}}
        self.filled: set[str] = set()  # arrays whose missing chunks are fill blocks
        self.multiscales: dict[str, N5Multiscale] = {}  # image group path -> its N5 conventions
        self.levels: dict[str, tuple[N5Multiscale, str]] = {}  # level array path -> (its image, path in it)
        for path, node in nodes.items():
            if isinstance(node, GroupModel):
                is_array = lambda p, g=path: isinstance(nodes.get(child_path(g, p)), ArrayModel)  # noqa: E731
                ms = N5Multiscale.from_attributes(node.attributes, is_array)
                if ms is not None:
                    self.multiscales[path] = ms
                    self.levels.update({child_path(path, p): (ms, p) for p in ms.levels})
        self.nodes = nodes
        for path, ms in self.multiscales.items():
            if set(self._shown_children(nodes[path])) & set(ms.names):  # a child already has a level's name
                ms.names = {}
        super().__init__(store, nodes, decoded, listings)

    def encoding(self, node: ArrayModel) -> Encoding:
        if node.warning:
            raise NotExpressible(node.warning)
        if not node.shape:
            raise NotExpressible("0-d arrays have no N5 form")
        if node.data_type not in DATA_TYPES:
            raise NotExpressible(f"data type {node.data_type!r} has no N5 equivalent")
        chain = Chain.parse(node.codecs, node.data_type, len(node.shape))
        if chain is None:
            raise NotExpressible(f"codecs {[name_of(c) for c in node.codecs]} cannot be decoded by zarr")
        enc = n5_encoding(node, chain, self.output_codec)
        try:
            fill = enc.fill()
        except (ValueError, TypeError) as e:
            raise NotExpressible(f"fill value {node.fill_value!r}: {e}") from None
        if np.any(fill.reshape(1).view(np.uint8)):  # N5 reads missing blocks as zero bytes
            self.filled.add(node.path)
        return enc

    def child_names(self, group: GroupModel) -> dict[str, str]:
        """In an OME image group the levels are s0, s1, ... (what N5 multiscale readers open);
        children that hold nothing but levels (ngff-zarr's `scale0/` groups) are not shown
        again under their stored names."""
        ms = self.multiscales.get(group.path)
        if ms is None or not ms.names:
            return super().child_names(group)
        return {**{n: n for n in self._shown_children(group)}, **ms.names}

    def _shown_children(self, group: GroupModel) -> list[str]:
        levels = {child_path(group.path, p) for p in self.multiscales[group.path].levels}
        return [n for n in group.children if not self._only_levels(child_path(group.path, n), levels)]

    def _only_levels(self, path: str, levels: set[str]) -> bool:
        """Whether everything under `path` is one of the image's levels."""
        node = self.nodes.get(path)
        if isinstance(node, ArrayModel):
            return path in levels
        return isinstance(node, GroupModel) and all(self._only_levels(child_path(path, c), levels) for c in node.children)

    def source(self, node: ArrayModel) -> ChunkSource:
        return FilledSource(node.chunks) if node.path in self.filled else node.chunks

    def _attributes(self, attrs: dict, own: dict, path: str) -> bytes:
        user = {k: v for k, v in attrs.items() if k not in own and k not in DATASET_KEYS and k != "n5"}
        root = {"n5": N5_VERSION} if path == "" else {}
        return json.dumps({**root, **user, **own}, indent=2).encode()

    def group_files(self, group: GroupModel) -> dict[str, bytes]:
        attrs = group.attributes
        ms = self.multiscales.get(group.path)
        if ms is not None:
            return {"attributes.json": self._attributes(ms.ome_attributes(attrs), ms.group_attributes(), group.path)}
        return {"attributes.json": self._attributes(attrs, {}, group.path)}

    def array_files(self, node: ArrayModel) -> dict[str, bytes]:
        enc = self.encodings[node.path]
        axes = n5_axes(enc.chain, node.ndim)
        own = {
            "dimensions": [node.shape[a] for a in axes],
            "blockSize": [node.chunk_shape[a] for a in axes],
            "dataType": node.data_type,
            "compression": n5_compression(enc.codec) if enc.codec else {"type": "raw"},
        }
        names = dimension_names(node)
        if names:
            own["axes"] = [names[a] for a in axes]
        if node.path in self.levels:
            ms, level = self.levels[node.path]
            own.update(ms.level_attributes(level))
        return {"attributes.json": self._attributes(per_dimension(node.attributes, node.ndim), own, node.path)}

    def layout(self, node: ArrayModel) -> Layout:
        return Layout(node.ndim > 0, n5_axes(self.encodings[node.path].chain, node.ndim))
