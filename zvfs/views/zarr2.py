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
"""

from __future__ import annotations

import json

from ..formats.array import ArrayModel, GroupModel
from ..formats.codecs import BLOSC_SHUFFLE, COMPRESSORS, VLEN, Chain, config_of, fill_value_json, name_of
from ..formats.zarr3 import ChunkKeyEncoding
from .chunks import Layout
from .hierarchy import HierarchyView, NotExpressible
from .ome import ome04_attributes
from .transcode import Encoding, zarr_encoding


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, indent=2).encode()


def v2_compressor(codec) -> dict:
    name, conf = name_of(codec), config_of(codec)
    if name == "gzip":
        return {"id": "gzip", "level": conf.get("level", 5)}
    if name == "zstd":
        # tensorstore refuses a "checksum" member; numcodecs decodes checksummed frames anyway
        return {"id": "zstd", "level": conf.get("level", 0), **({"checksum": True} if conf.get("checksum") else {})}
    shuffle = conf.get("shuffle", "noshuffle")
    return {"id": "blosc", "cname": conf.get("cname", "lz4"), "clevel": conf.get("clevel", 5),
            "shuffle": BLOSC_SHUFFLE.get(shuffle, shuffle), "blocksize": conf.get("blocksize", 0)}


def dimension_names(node: ArrayModel) -> list[str] | None:
    """The dimension names when every axis has one (what `_ARRAY_DIMENSIONS` and N5 `axes` need)."""
    names = node.dimension_names
    return list(names) if names and all(isinstance(n, str) for n in names) else None


class Zarr2View(HierarchyView):
    name = "zarr2"

    def _chain(self, node: ArrayModel) -> Chain:
        if node.warning:
            raise NotExpressible(node.warning)
        chain = Chain.parse(node.codecs, node.data_type, len(node.shape))
        if chain is None or not chain.plain or any(name_of(c) not in COMPRESSORS for c in chain.compressors):
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
        return zarr_encoding(self.name, node, self._chain(node))

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
            # vlen-bytes: None, as zarr-python 2 writes it (its JSON form of b"" would read back as "")
            "fill_value": None if chain.serializer == "vlen-bytes" else fill_value_json(node.data_type, node.fill_value, 2),
            "order": "F" if chain.order is not None and ndim > 1 and chain.order == tuple(reversed(range(ndim))) else "C",
            "filters": [{"id": chain.serializer}] if vlen else None,
            "dimension_separator": node.separator,
        }
        attrs = dict(ome04_attributes(node.attributes))
        names = dimension_names(node)
        if names:
            attrs["_ARRAY_DIMENSIONS"] = names
        files = {".zarray": _dumps(zarray)}
        if attrs:
            files[".zattrs"] = _dumps(attrs)
        return files

    def layout(self, node: ArrayModel) -> Layout:
        return Layout.zarr(ChunkKeyEncoding("v2", node.separator), len(node.shape))
