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
both). Otherwise blocks are transcoded (views/transcode.py): decoded with the array's codecs
(formats/codecs.py: the standard chains with numcodecs, any other that zarr-python 3 decodes;
with output limits), cropped at the array end,
byte-swapped, encoded with `n5_compression` (raw by default, so their sizes are known
without decoding).

N5 has no fill value: in an array whose fill value is not zero, a chunk that is not stored is
a fill block. Fill blocks are found by name (a lookup of any grid position) but listings show
only the stored chunks: listing them would mean building every grid position (a 10^6-chunk
grid is 10^6 entries for a handful of stored chunks).

OME-Zarr multiscale images carry the N5 multiscale conventions (views/ome.py); their levels
are named s0, s1, ... as those tools require. OME-Zarr 0.5 groups (images, labels, HCS plates
and wells) carry their OME metadata in the 0.4 form, the one N5 tools that read OME-NGFF from
N5 containers know (0.5 exists only for Zarr v3).

Attributes: N5 readers give meaning to some attribute names (the N5 spec's dataset keys,
tensorstore's per-dimension `axes`, `units`, `resolution`, the multiscale conventions of
BigDataViewer, n5-viewer and Paintera). A store's attribute of such a name would be read as
that key: CF's `units: "K"` is read by tensorstore as the units of each dimension, which
refuses the dataset ("Expected array"). So such attributes move under one key, `zarr`
(`{"zarr": {"attributes": {"units": "K"}}}`); every other attribute stays where it is. The
only ones kept in place are per-dimension conventions of an array whose N5 dimensions are its
own axes (Fortran-ordered) when they already have the convention's form: the `resolution`,
`pixelResolution` and `downsamplingFactors` a precomputed scale carries for N5 viewers. Every
dataset also says, under `zarr.axis_order`, which axis of the array each N5 dimension is
(reversed for C-ordered arrays, kept for Fortran-ordered ones), besides the N5 `axes` named
from the dimension names.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ..formats.array import ArrayModel, ChunkSource, GroupModel
from ..formats.codecs import BLOSC_SHUFFLE, Chain, config_of, name_of, undecodable
from ..formats.zarr3 import child_path
from .chunks import Layout
from .hierarchy import HierarchyView, NotExpressible
from .ome import N5Multiscale, ome04_attributes
from .transcode import Encoding, simple
from .zarr2 import FilledSource, dimension_names

N5_VERSION = "2.0.0"  # older Java readers refuse newer versions than theirs
DATA_TYPES = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"}
#: the key that holds what N5 names cannot (see the module docstring)
NAMESPACE = "zarr"
#: attribute names N5 readers give a meaning: the N5 spec (the root's version, the dataset
#: keys, N5 1.x's `compressionType`), tensorstore's n5 driver (`axes`, `units`, `resolution`,
#: one entry per dimension), the multiscale conventions of BigDataViewer, n5-viewer and
#: Paintera (`multiScale`, `scales`, `downsamplingFactors`, `pixelResolution`, `offset`,
#: `affineTransform`), and the namespace itself
RESERVED = frozenset({"n5", "dimensions", "blockSize", "dataType", "compression", "compressionType", "axes", "units",
                      "resolution", "multiScale", "scales", "downsamplingFactors", "pixelResolution", "offset",
                      "affineTransform", NAMESPACE})


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


def _numbers(value, ndim: int) -> bool:
    return (isinstance(value, list) and 0 < len(value) <= ndim
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


#: per-dimension conventions a Fortran-ordered array may carry in place, and their form
CONVENTION_FORMS = {
    "resolution": _numbers,
    "downsamplingFactors": _numbers,
    "units": lambda v, n: isinstance(v, list) and 0 < len(v) <= n and all(isinstance(u, str) for u in v),
    "pixelResolution": lambda v, n: (isinstance(v, dict) and set(v) == {"unit", "dimensions"}
                                     and isinstance(v["unit"], str) and _numbers(v["dimensions"], n)),
}


def in_convention_form(key: str, value, ndim: int) -> bool:
    """Whether an attribute already is what the N5 conventions mean by its name for a dataset
    of `ndim` dimensions listed in the array's own axis order."""
    form = CONVENTION_FORMS.get(key)
    return form is not None and form(value, ndim)


def n5_attributes(attrs: dict, own: dict, zarr: dict, keep=lambda key, value: False) -> dict:
    """`own` (the view's N5 keys) and the stored attributes: those of a reserved name under
    `zarr.attributes` unless `keep(name, value)` (and not one of `own`'s), beside `zarr`'s
    entries (the axis order)."""
    user, moved = {}, {}
    for key, value in attrs.items():
        if key in RESERVED and (key in own or not keep(key, value)):
            moved[key] = value
        else:
            user[key] = value
    namespace = {**zarr, **({"attributes": moved} if moved else {})}
    return {**user, **own, **({NAMESPACE: namespace} if namespace else {})}


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


class N5View(HierarchyView):
    name = "n5"

    def __init__(self, store, nodes, *args, compression: str = "raw", **kwargs):
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
        super().__init__(store, nodes, *args, **kwargs)

    def encoding(self, node: ArrayModel) -> Encoding:
        if node.warning:
            raise NotExpressible(node.warning)
        if not node.shape:
            raise NotExpressible("0-d arrays have no N5 form")
        if node.data_type not in DATA_TYPES:
            raise NotExpressible(f"data type {node.data_type!r} has no N5 equivalent")
        chain = Chain.parse(node.codecs, node.data_type, len(node.shape))
        if chain is None:
            raise NotExpressible(undecodable(node.codecs, node.data_type))
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

    @staticmethod
    def _file(path: str, attributes: dict) -> dict[str, bytes]:
        root = {"n5": N5_VERSION} if path == "" else {}
        return {"attributes.json": json.dumps({**root, **attributes}, indent=2).encode()}

    def group_files(self, group: GroupModel) -> dict[str, bytes]:
        attrs = group.attributes
        ms = self.multiscales.get(group.path)
        if ms is not None:
            return self._file(group.path, n5_attributes(ms.ome_attributes(attrs), ms.group_attributes(), {}))
        return self._file(group.path, n5_attributes(ome04_attributes(attrs), {}, {}))

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
        own_order = axes == tuple(range(node.ndim))  # lists in the array's axis order are in N5's

        def keep(key, value) -> bool:
            return own_order and in_convention_form(key, value, node.ndim)

        attrs = n5_attributes(node.attributes, own, {"axis_order": list(axes)}, keep)
        return self._file(node.path, per_dimension(attrs, node.ndim))

    def layout(self, node: ArrayModel) -> Layout:
        return Layout(node.ndim > 0, n5_axes(self.encodings[node.path].chain, node.ndim))
