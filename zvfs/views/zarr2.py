"""The Zarr v2 view of an array model hierarchy (Zarr v3 sharded or not, ZVF, precomputed
volume scales).

An array is expressible when its (innermost) chunk codecs are
`[transpose fully reversed]? (bytes | vlen-bytes | vlen-utf8) [gzip | zstd | blosc]?`: then the chunk bytes
pass through unchanged under v2 keys (edge chunks of models that store them cropped are
padded, views/transcode.py), and `.zarray` says the same thing in v2 terms (dtype
with the byte order of the `bytes` codec, `order` "F" for a reversing transpose, one
compressor, the `vlen-bytes`/`vlen-utf8` filter for variable-length values, the fill value in v2's JSON
form for the data type). `.zattrs` carries the attributes plus `_ARRAY_DIMENSIONS` from
`dimension_names`, with OME-Zarr 0.5 metadata in its OME-NGFF 0.4 form (views/ome.py), so
that 0.4 tools find the images.

CF variables and xarray. xarray reads a v2 array's `fill_value` as CF's `_FillValue` (values
equal to it become NaN, NaT) but a v3 array's only from its `_FillValue` attribute
(xarray/backends/zarr.py, `use_zarr_fill_value_as_mask`: True for v2, False for v3; the
zarr backend of xarray 2026.9 drops the keyword a user passes, pydata/xarray#10269). Shown with the
v3 fill value, xarray-written data read through the view lost real values: an uint8 mask's
zeros became NaN, `time[0]` (0 hours since the epoch) NaT. So the arrays xarray reads as CF
variables (named dimensions, a bool or numeric data type, in a group where some array carries
a CF attribute, `CF_ATTRIBUTES`) get the `fill_value` xarray's own v2 writer gives them: their
`_FillValue` attribute decoded as xarray decodes it, or null. Where that is not the stored
fill value, chunks that are not stored are fill chunks (found by name, not listed, as in the
N5 view), so every v2 reader still reads the original's values through the mount
(zarr-python 2 leaves the missing chunks of a null-filled array uninitialized).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct

from ..formats.array import ArrayModel, ChunkSource, ChunkTableLike, GroupModel
from ..formats.chunkref import ChunkRef
from ..formats.codecs import (
    BLOSC_SHUFFLE,
    COMPRESSORS,
    VLEN,
    Chain,
    config_of,
    fill_value_json,
    name_of,
    undecodable,
)
from ..formats.zarr3 import ChunkKeyEncoding
from .chunks import Layout
from .hierarchy import HierarchyView, NotExpressible
from .ome import ome04_attributes
from .transcode import FILL_KEY, Encoding, zarr_encoding

#: attributes that make an array a CF variable (what xarray's CF decoding acts on, and CF's
#: names for a variable); every named array of a group holding one is read as a CF variable
CF_ATTRIBUTES = frozenset({"_FillValue", "missing_value", "scale_factor", "add_offset", "units", "calendar",
                           "standard_name", "long_name"})
#: the data types xarray masks with `_FillValue`
CF_DATA_TYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                           "float16", "float32", "float64"})


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, indent=2).encode()


def v2_compressor(codec) -> dict:
    name, conf = name_of(codec), config_of(codec)
    if name == "gzip":
        return {"id": "gzip", "level": conf.get("level", 5)}
    if name == "zstd":
        # never a "checksum" member: tensorstore's zarr driver refuses it, and it only tells a
        # writer to add checksums (zstd frames say whether they carry one; every reader checks it)
        return {"id": "zstd", "level": conf.get("level", 0)}
    shuffle = conf.get("shuffle", "noshuffle")
    return {"id": "blosc", "cname": conf.get("cname", "lz4"), "clevel": conf.get("clevel", 5),
            "shuffle": BLOSC_SHUFFLE.get(shuffle, shuffle), "blocksize": conf.get("blocksize", 0)}


def dimension_names(node: ArrayModel) -> list[str] | None:
    """The dimension names when every axis has one (what `_ARRAY_DIMENSIONS` and N5 `axes` need)."""
    names = node.dimension_names
    return list(names) if names and all(isinstance(n, str) for n in names) else None


def v2_dimensions(node: ArrayModel) -> list[str] | None:
    """`_ARRAY_DIMENSIONS`: the dimension names, and [] for a 0-d array (no axis to name; xarray
    reads a Zarr v3 scalar without `dimension_names` so, and cannot open a v2 group holding
    one without it: a CF dataset's scalar coordinates, `number`, `step`)."""
    return [] if not node.shape else dimension_names(node)


def cf_fill_value(data_type: str, attributes: dict):
    """The `_FillValue` attribute of a CF variable as xarray decodes it from a Zarr v3 array
    (floats: base64 of a little-endian double, as xarray writes it; a plain number is taken as
    it is), in the Zarr v3 JSON form of `data_type`; None without one. ValueError when it is
    no value of the data type."""
    value = attributes.get("_FillValue")
    if value is None:
        return None
    if data_type.startswith("float"):
        if isinstance(value, str):
            try:
                raw = base64.b64decode(value, validate=True)
            except binascii.Error:
                raise ValueError(f"_FillValue {value!r} is not base64") from None
            if len(raw) != 8:
                raise ValueError(f"_FillValue {value!r} is not a double")
            value = struct.unpack("<d", raw)[0]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"_FillValue {value!r} is not a number")
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity"))
    if data_type == "bool":
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"_FillValue {value!r} is not an integer")
    return int(value)


class FilledSource:
    """A chunk source where every grid position exists: a chunk not stored is a fill chunk
    (`FILL_KEY`, built from the array's fill value). Listings (tables) show the stored chunks
    only: listing the others would mean building every grid position (a 10^6-chunk grid is
    10^6 entries for a handful of stored chunks). Used where the view's format has no fill
    value for them (N5) or says another one (CF variables here)."""

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

    @property
    def per_shard(self) -> tuple[int, ...] | None:
        return getattr(self.inner, "per_shard", None)

    def row_dir(self, prefix: tuple[int, ...]) -> str | None:
        row_dir = getattr(self.inner, "row_dir", None)
        return None if row_dir is None else row_dir(prefix)

    async def scan(self, fixed: dict[int, int], visit, wanted=None) -> None:
        """The inner source's tables for a listing, a few at a time where it can (chunks.py)."""
        scan = getattr(self.inner, "scan", None)
        if scan is not None:
            await scan(fixed, visit, wanted)
            return
        for table in await self.inner.tables(fixed):
            visit(table, False)


class Zarr2View(HierarchyView):
    name = "zarr2"

    def __init__(self, store, nodes, *args, **kwargs):
        #: groups holding a CF variable (a root array: "" when it is one)
        self.cf_groups = {path.rpartition("/")[0] for path, node in nodes.items()
                          if isinstance(node, ArrayModel) and CF_ATTRIBUTES & node.attributes.keys()}
        self.fill_values: dict[str, object] = {}  # array path -> its v2 fill_value
        self.filled: set[str] = set()  # arrays whose missing chunks are fill chunks
        super().__init__(store, nodes, *args, **kwargs)

    def _chain(self, node: ArrayModel) -> Chain:
        if node.warning:
            raise NotExpressible(node.warning)
        chain = Chain.parse(node.codecs, node.data_type, len(node.shape))
        if chain is None:
            raise NotExpressible(undecodable(node.codecs, node.data_type))
        if not chain.plain or any(name_of(c) not in COMPRESSORS for c in chain.compressors):
            raise NotExpressible(f"codecs {[name_of(c) for c in node.codecs]} have no Zarr v2 equivalent")
        if len(chain.compressors) > 1:
            raise NotExpressible("more than one bytes->bytes codec (v2 has one compressor)")
        ndim = len(node.shape)
        if chain.order not in (None, tuple(range(ndim)), tuple(reversed(range(ndim)))):
            raise NotExpressible(f"transpose {list(chain.order)} is neither C nor F order")
        if chain.dtype().fields is not None:
            raise NotExpressible("structured data types are not shown")
        try:
            fill_value_json(node.data_type, node.fill_value, 2)
        except (ValueError, TypeError) as e:
            raise NotExpressible(f"fill value {node.fill_value!r}: {e}") from None
        return chain

    def encoding(self, node: ArrayModel) -> Encoding:
        chain = self._chain(node)
        self.fill_values[node.path] = self._fill_value(node, chain)
        return zarr_encoding(self.name, node, chain)

    def _fill_value(self, node: ArrayModel, chain: Chain):
        """The v2 `fill_value`: the stored one, or for a CF variable xarray's (module
        docstring); then missing chunks are fill chunks where the two differ."""
        if chain.serializer == "vlen-bytes":
            return None  # as zarr-python 2 writes it (its JSON form of b"" would read back as "")
        stored = fill_value_json(node.data_type, node.fill_value, 2)
        cf_variable = (node.data_type in CF_DATA_TYPES and v2_dimensions(node) is not None
                       and node.path.rpartition("/")[0] in self.cf_groups)
        if not cf_variable:
            return stored
        try:
            cf = cf_fill_value(node.data_type, node.attributes)
            fill = None if cf is None else fill_value_json(node.data_type, cf, 2)
        except (ValueError, TypeError):  # xarray cannot decode it from the original either
            return stored
        if fill is None and stored == "NaN":
            return stored  # xarray masks no value with NaN: the stored fill value reads the same
        if fill != stored:
            self.filled.add(node.path)
        return fill

    def source(self, node: ArrayModel) -> ChunkSource:
        return FilledSource(node.chunks) if node.path in self.filled else node.chunks

    def group_files(self, group: GroupModel) -> dict[str, bytes]:
        files = {".zgroup": _dumps({"zarr_format": 2})}
        if group.attributes:
            files[".zattrs"] = _dumps(ome04_attributes(group.attributes))
        return files

    def array_files(self, node: ArrayModel) -> dict[str, bytes]:
        chain = self.encodings[node.path].chain
        ndim = len(node.shape)
        vlen = chain.serializer in VLEN
        zarray = {
            "zarr_format": 2,
            "shape": list(node.shape),
            "chunks": list(node.chunk_shape),
            "dtype": "|O" if vlen else chain.dtype().str,
            "compressor": v2_compressor(chain.compressors[0]) if chain.compressors else None,
            "fill_value": self.fill_values[node.path],
            "order": "F" if chain.order is not None and ndim > 1 and chain.order == tuple(reversed(range(ndim))) else "C",
            "filters": [{"id": chain.serializer}] if vlen else None,
            "dimension_separator": node.separator,
        }
        attrs = dict(ome04_attributes(node.attributes))
        names = v2_dimensions(node)
        if names is not None:
            attrs["_ARRAY_DIMENSIONS"] = names
        files = {".zarray": _dumps(zarray)}
        if attrs:
            files[".zattrs"] = _dumps(attrs)
        return files

    def layout(self, node: ArrayModel) -> Layout:
        return Layout.zarr(ChunkKeyEncoding("v2", node.separator), len(node.shape))
