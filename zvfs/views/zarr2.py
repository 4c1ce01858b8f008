"""The Zarr v2 view of a Zarr v3 hierarchy (sharded or not, ZVF stores included).

An array is expressible when its (innermost) chunk codecs are
`[transpose fully reversed]? (bytes | vlen-bytes | vlen-utf8) [gzip | zstd | blosc]?`: then the chunk bytes
pass through unchanged under v2 keys, and `.zarray` says the same thing in v2 terms (dtype
with the byte order of the `bytes` codec, `order` "F" for a reversing transpose, one
compressor, the `vlen-bytes`/`vlen-utf8` filter for variable-length values, the fill value in v2's JSON
form for the data type). `.zattrs` carries the attributes plus `_ARRAY_DIMENSIONS` from
`dimension_names`, with OME-Zarr 0.5 metadata in its OME-NGFF 0.4 form (views/ome.py), so
that 0.4 tools find the images.
"""

from __future__ import annotations

import json

from ..formats.codecs import BLOSC_SHUFFLE, COMPRESSORS, VLEN, Chain, config_of, fill_value_json, name_of
from ..formats.zarr3 import ArrayNode, GroupNode
from ..tree import RangeFile
from .chunks import Layout, MakeFile
from .hierarchy import HierarchyView, NotExpressible
from .ome import ome04_attributes


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


def leaf_codecs(node: ArrayNode) -> list:
    return node.plan.codecs if node.plan is not None else node.meta["codecs"]


def leaf_chunks(node: ArrayNode) -> tuple[int, ...]:
    return node.plan.chunk_shape if node.plan is not None else node.chunk_shape


class Zarr2View(HierarchyView):
    name = "zarr2"

    def _chain(self, node: ArrayNode) -> Chain:
        if node.warning:
            raise NotExpressible(node.warning)
        if node.meta.get("storage_transformers"):
            raise NotExpressible("storage transformers")
        chain = Chain.parse(leaf_codecs(node), node.meta["data_type"], len(node.shape))
        if chain is None or not chain.plain or any(name_of(c) not in COMPRESSORS for c in chain.compressors):
            raise NotExpressible(f"codecs {[name_of(c) for c in leaf_codecs(node)]} have no Zarr v2 equivalent")
        if len(chain.compressors) > 1:
            raise NotExpressible("more than one bytes->bytes codec (v2 has one compressor)")
        ndim = len(node.shape)
        if chain.order not in (None, tuple(range(ndim)), tuple(reversed(range(ndim)))):
            raise NotExpressible(f"transpose {list(chain.order)} is neither C nor F order")
        if chain.dtype().fields is not None:
            raise NotExpressible("structured data types are not shown")
        try:
            fill_value_json(node.meta["data_type"], node.meta.get("fill_value"), 2)
        except (ValueError, TypeError) as e:
            raise NotExpressible(f"fill value {node.meta.get('fill_value')!r}: {e}") from None
        return chain

    def check(self, node: ArrayNode) -> None:
        self._chain(node)

    def group_files(self, group: GroupNode) -> dict[str, bytes]:
        files = {".zgroup": _dumps({"zarr_format": 2})}
        if group.meta.get("attributes"):
            files[".zattrs"] = _dumps(ome04_attributes(group.meta["attributes"]))
        return files

    def array_files(self, node: ArrayNode) -> dict[str, bytes]:
        chain = self._chain(node)
        meta, ndim = node.meta, len(node.shape)
        vlen = chain.serializer in VLEN
        zarray = {
            "zarr_format": 2,
            "shape": list(node.shape),
            "chunks": list(leaf_chunks(node)),
            "dtype": "|O" if vlen else chain.dtype().str,
            "compressor": v2_compressor(chain.compressors[0]) if chain.compressors else None,
            # vlen-bytes: None, as zarr-python 2 writes it (its JSON form of b"" would read back as "")
            "fill_value": None if chain.serializer == "vlen-bytes" else fill_value_json(meta["data_type"], meta.get("fill_value"), 2),
            "order": "F" if chain.order is not None and ndim > 1 and chain.order == tuple(reversed(range(ndim))) else "C",
            "filters": [{"id": chain.serializer}] if vlen else None,
            "dimension_separator": node.encoding.separator,
        }
        attrs = dict(ome04_attributes(meta.get("attributes") or {}))
        names = meta.get("dimension_names")
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            attrs["_ARRAY_DIMENSIONS"] = names
        files = {".zarray": _dumps(zarray)}
        if attrs:
            files[".zattrs"] = _dumps(attrs)
        return files

    def layout(self, node: ArrayNode) -> Layout:
        return Layout.zarr(node.encoding, len(node.shape), v2_keys=True)

    def make_file(self, node: ArrayNode, source) -> MakeFile:
        return lambda ino, ref, coords: RangeFile(ino, self.store, ref)
