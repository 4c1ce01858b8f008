"""Fixture writers: sharded Zarr v3 stores written by zarr-python and by tensorstore.

Every writer is a plain function taking a directory and returning a list of ``ArrayInfo``
(one per array written).  The catalogue of arrays is static (``CASES``) so tests can be
parametrized over it at collection time; the writers only turn a case into files.

Facts verified while writing these (zarr 3.1.6, tensorstore 0.1.86):

* zarr-python ``create_array(chunks=inner, shards=shard, compressors=[...])`` writes
  ``[sharding_indexed(inner codecs=[bytes, *compressors], index=[bytes little, crc32c], end)]``.
* Any other sharding layout (index at start, no crc32c, big-endian index, nested sharding,
  transpose before sharding) works with ``create_array(chunks=shard,
  serializer=ShardingCodec(...), filters=[TransposeCodec(...)], compressors=None)``.
  ``compressors`` MUST be given as ``None`` there: its default ("auto") appends zstd *after*
  the sharding codec.  ``compressors=[GzipCodec()]`` with a ShardingCodec serializer is how the
  "bytes->bytes codec after sharding" case is written.
* zarr-python checks the shard shape against the inner chunk shape *before* the transpose, the
  spec (and tensorstore) after it: transpose cases use inner shapes that divide both orders.
* 0-d sharded arrays: ``create_array(shards=())`` crashes in zarr-python; the serializer form works.
* tensorstore: ``ts.open({"driver": "zarr3", "kvstore": ..., "metadata": {... "codecs": [...]}},
  create=True)`` takes any of these codec chains as JSON (``index_codecs`` with
  ``{"endian": "big"}``, no crc32c, ``index_location: "start"``, nested sharding, transpose).
  It refuses bytes->bytes codecs after sharding (that case is hand-built) and cannot write
  group metadata (groups are created with zarr-python).
* Both writers skip inner chunks and shards that hold only the fill value (NaN included), and the
  same data written unsharded (chunk = inner shape, same inner codecs) gives the same chunk keys
  with byte-identical chunk files.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

WRITERS = ("zarr-python", "tensorstore")

BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}
BYTES_BE = {"name": "bytes", "configuration": {"endian": "big"}}
CRC32C = {"name": "crc32c"}
GZIP = {"name": "gzip", "configuration": {"level": 5}}
ZSTD = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}


def blosc(typesize: int) -> dict:
    return {
        "name": "blosc",
        "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": typesize,
                          "blocksize": 0},
    }


@dataclass(frozen=True)
class Case:
    """One array of the fixture catalogue (shapes in array order unless said otherwise)."""

    path: str
    shape: tuple
    dtype: str
    chunk: tuple  # shard shape if sharded, else the chunk shape
    inner: tuple | None = None  # inner chunk shape as written in the sharding config
    nested: tuple | None = None  # innermost chunk shape of a nested sharding codec
    compressor: str | None = None  # None, "gzip", "zstd", "blosc"
    fill: Any = 0
    data_endian: str = "little"
    index_endian: str = "little"
    index_crc: bool = True
    index_location: str = "end"
    transpose: tuple | None = None  # transpose codec placed before sharding
    cke: dict | None = None  # chunk_key_encoding JSON (None: default "/")
    attributes: dict = field(default_factory=dict)
    dimension_names: tuple | None = None
    # "bytes_after": sharding followed by gzip over the whole shard; "storage_transformer":
    # zarr.json hand-edited to carry a storage transformer. Both must be shown as stored.
    stored_as_is: str | None = None
    extra_json: dict | None = None  # unknown top-level zarr.json keys added by hand

    @property
    def sharded(self) -> bool:
        return self.inner is not None

    @property
    def unshardable(self) -> bool:
        return self.sharded and self.stored_as_is is None


@dataclass
class ArrayInfo:
    """What a writer wrote: the case, the data and where it lives."""

    case: Case
    path: str  # relative to the store root
    data: np.ndarray
    directory: Path

    @property
    def sharded(self) -> bool:
        return self.case.sharded

    @property
    def unshardable(self) -> bool:
        return self.case.unshardable


S2 = dict(shape=(20, 27), chunk=(8, 10), inner=(4, 5))  # 3x3 shards, edge shards in both dims

CASES: list[Case] = [
    # dtypes x codecs
    Case("dtypes/uint8_raw", dtype="uint8", **S2,
         attributes={"description": "uint8, no compressor", "nested": {"a": [1, 2, None]}}),
    Case("dtypes/uint16_gzip", dtype="uint16", compressor="gzip", **S2, dimension_names=("y", "x")),
    Case("dtypes/int64_zstd", dtype="int64", compressor="zstd", **S2),
    Case("dtypes/float32_blosc", dtype="float32", compressor="blosc", **S2),
    Case("dtypes/uint16_bigendian_data", dtype="uint16", data_endian="big", **S2),
    # fill values
    Case("fill/uint16_fill7_gzip", dtype="uint16", compressor="gzip", fill=7, **S2),
    Case("fill/float32_nan_zstd", dtype="float32", compressor="zstd", fill="NaN", **S2),
    Case("fill/int64_fill7_raw", dtype="int64", fill=7, **S2),
    # shard index variants
    Case("index/start_crc", dtype="uint16", index_location="start", **S2),
    Case("index/start_nocrc", dtype="uint16", index_location="start", index_crc=False, **S2),
    Case("index/end_nocrc", dtype="uint16", index_crc=False, compressor="gzip", **S2),
    Case("index/end_bigendian_crc", dtype="uint16", index_endian="big", **S2),
    Case("index/start_bigendian_nocrc", dtype="float32", index_endian="big", index_crc=False,
         index_location="start", fill="NaN", **S2),
    # nested sharding (sharding_indexed inside sharding_indexed)
    Case("nested/two_level_2d", dtype="uint16", shape=(20, 27), chunk=(8, 10), inner=(4, 10),
         nested=(2, 5), compressor="gzip"),
    Case("nested/two_level_3d", dtype="int64", shape=(9, 10, 11), chunk=(4, 4, 8), inner=(2, 4, 4),
         nested=(1, 2, 2), index_location="start", fill=7),
    # transpose before sharding (inner shape given in transposed order)
    Case("transpose/t2d", dtype="uint16", shape=(20, 27), chunk=(8, 12), inner=(4, 2),
         transpose=(1, 0), compressor="zstd"),
    Case("transpose/t3d", dtype="float32", shape=(10, 12, 14), chunk=(4, 6, 8), inner=(4, 2, 2),
         transpose=(2, 0, 1), fill="NaN", index_location="start"),
    # 0-d .. 5-d (2-d is everywhere above)
    Case("dims/d0", dtype="uint16", shape=(), chunk=(), inner=(), fill=3),
    Case("dims/d1", dtype="int64", shape=(1000,), chunk=(128,), inner=(16,), compressor="gzip"),
    Case("dims/d3", dtype="uint8", shape=(10, 12, 14), chunk=(4, 6, 8), inner=(2, 3, 4),
         dimension_names=("z", "y", "x")),
    Case("dims/d4", dtype="float32", shape=(4, 5, 6, 7), chunk=(2, 4, 4, 4), inner=(1, 2, 2, 2),
         compressor="zstd"),
    Case("dims/d5", dtype="uint16", shape=(3, 4, 5, 6, 7), chunk=(2, 2, 4, 4, 4),
         inner=(1, 1, 2, 2, 4), fill=7),
    # chunk key encodings (default "/" is everywhere above)
    Case("keys/default_dot", dtype="uint16", cke={"name": "default", "configuration": {"separator": "."}},
         **S2),
    Case("keys/v2_dot", dtype="uint16", cke={"name": "v2", "configuration": {"separator": "."}}, **S2),
    Case("keys/v2_slash", dtype="uint16", cke={"name": "v2", "configuration": {"separator": "/"}},
         compressor="gzip", **S2),
    Case("keys/v2_dot_d0", dtype="uint8", shape=(), chunk=(), inner=(), fill=1,
         cke={"name": "v2", "configuration": {"separator": "."}}),
    # unknown zarr.json key (must be copied unchanged)
    Case("extra/unknown_key", dtype="uint16", **S2,
         extra_json={"zvfs_test_extension": {"must_understand": False, "value": [1, 2, 3]}}),
    # not sharded: pass through
    Case("plain/unsharded_gzip", dtype="uint16", shape=(20, 27), chunk=(8, 10), compressor="gzip"),
    Case("plain/unsharded_transpose", dtype="int64", shape=(10, 12, 14), chunk=(4, 6, 8),
         transpose=(2, 1, 0)),
    # sharded but not unshardable: shown exactly as stored
    Case("stored/bytes_after_sharding", dtype="uint16", stored_as_is="bytes_after", **S2),
    Case("stored/storage_transformer", dtype="uint16", stored_as_is="storage_transformer", **S2),
    # a group with consolidated metadata
    Case("consolidated/a", dtype="uint16", compressor="gzip", **S2),
    Case("consolidated/sub/b", dtype="float32", shape=(10, 12, 14), chunk=(4, 6, 8), inner=(4, 2, 2),
         transpose=(2, 0, 1), fill="NaN"),
    Case("consolidated/plain", dtype="uint8", shape=(20, 27), chunk=(8, 10)),
    # OME-Zarr-like multiscale group
    Case("ome/0", dtype="uint16", shape=(4, 24, 32), chunk=(2, 16, 16), inner=(1, 8, 8),
         compressor="zstd", dimension_names=("z", "y", "x")),
    Case("ome/1", dtype="uint16", shape=(2, 12, 16), chunk=(2, 8, 8), inner=(1, 4, 4),
         compressor="zstd", dimension_names=("z", "y", "x")),
    Case("ome/2", dtype="uint16", shape=(1, 6, 8), chunk=(1, 8, 8), inner=(1, 4, 4),
         compressor="zstd", dimension_names=("z", "y", "x")),
    Case("ome/labels/cells/0", dtype="int64", shape=(4, 24, 32), chunk=(2, 16, 16), inner=(1, 8, 8),
         compressor="gzip", dimension_names=("z", "y", "x")),
]

CASES_BY_PATH = {c.path: c for c in CASES}


def _multiscales(name: str, n: int) -> list:
    return [{
        "name": name,
        "axes": [{"name": "z", "type": "space", "unit": "micrometer"},
                 {"name": "y", "type": "space", "unit": "micrometer"},
                 {"name": "x", "type": "space", "unit": "micrometer"}],
        "datasets": [{"path": str(i), "coordinateTransformations": [
            {"type": "scale", "scale": [2.0 ** i if i else 1.0, 0.5 * 2 ** i, 0.5 * 2 ** i]}]}
            for i in range(n)],
        "type": "mean",
    }]


# Group path -> attributes. Groups are always written by zarr-python.
GROUPS: dict[str, dict] = {
    "": {"title": "zvfs test store", "nested": {"list": [1, 2.5, "x", None], "flag": True}},
    "dtypes": {}, "fill": {}, "index": {}, "nested": {}, "transpose": {}, "dims": {}, "keys": {},
    "extra": {}, "plain": {}, "stored": {},
    "consolidated": {"kind": "consolidated"},
    "consolidated/sub": {"inner": 1},
    "ome": {"ome": {"version": "0.5", "multiscales": _multiscales("image", 3)}},
    "ome/labels": {"ome": {"version": "0.5", "labels": ["cells"]}},
    "ome/labels/cells": {"ome": {"version": "0.5", "image-label": {"version": "0.5", "colors": [
        {"label-value": 1, "rgba": [255, 0, 0, 255]}]}, "multiscales": _multiscales("cells", 1)}},
}
CONSOLIDATED_GROUPS = ("consolidated",)


# ----------------------------------------------------------------------------------------------
# codec JSON


def compressor_json(case: Case) -> list[dict]:
    if case.compressor is None:
        return []
    if case.compressor == "gzip":
        return [copy.deepcopy(GZIP)]
    if case.compressor == "zstd":
        return [copy.deepcopy(ZSTD)]
    if case.compressor == "blosc":
        return [blosc(np.dtype(case.dtype).itemsize)]
    raise ValueError(case.compressor)


def leaf_codecs_json(case: Case) -> list[dict]:
    """Codecs of the innermost (stored-per-file-when-unsharded) chunk."""
    return [copy.deepcopy(BYTES_BE if case.data_endian == "big" else BYTES_LE)] + compressor_json(case)


def index_codecs_json(case: Case) -> list[dict]:
    return [copy.deepcopy(BYTES_BE if case.index_endian == "big" else BYTES_LE)] + (
        [copy.deepcopy(CRC32C)] if case.index_crc else [])


def sharding_json(case: Case) -> dict:
    inner_codecs = leaf_codecs_json(case)
    if case.nested is not None:
        inner_codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(case.nested), "codecs": inner_codecs,
            "index_codecs": index_codecs_json(case), "index_location": case.index_location}}]
    return {"name": "sharding_indexed", "configuration": {
        "chunk_shape": list(case.inner), "codecs": inner_codecs,
        "index_codecs": index_codecs_json(case), "index_location": case.index_location}}


def transpose_json(case: Case) -> list[dict]:
    return [] if case.transpose is None else [
        {"name": "transpose", "configuration": {"order": list(case.transpose)}}]


def codecs_json(case: Case) -> list[dict]:
    """Full codec chain of the array as written (sharded if the case is)."""
    if not case.sharded:
        return transpose_json(case) + leaf_codecs_json(case)
    return transpose_json(case) + [sharding_json(case)]


def leaf_shape(case: Case) -> tuple:
    """Innermost chunk shape in array order (the unsharded chunk shape)."""
    t = case.nested if case.nested is not None else case.inner
    if case.transpose is None:
        return tuple(t)
    out = [0] * len(t)
    for i, p in enumerate(case.transpose):
        out[p] = t[i]
    return tuple(out)


def unsharded_case(case: Case) -> Case:
    """The same array with one file per innermost chunk (the twin)."""
    if not case.sharded:
        return case
    return Case(case.path, shape=case.shape, dtype=case.dtype, chunk=leaf_shape(case),
                compressor=case.compressor, fill=case.fill, data_endian=case.data_endian,
                transpose=case.transpose, cke=case.cke, attributes=case.attributes,
                dimension_names=case.dimension_names, extra_json=case.extra_json)


# ----------------------------------------------------------------------------------------------
# data


def fill_scalar(case: Case):
    return np.nan if case.fill == "NaN" else case.fill


def make_data(case: Case) -> np.ndarray:
    """Deterministic data with a missing shard and some fill-only inner chunks.

    * shard #1 (C order over the shard grid) holds only the fill value: never written;
    * leaf chunk #1 of shard #0 and the last leaf chunk of shard #2 hold only the fill value:
      empty entries inside written shards.
    Values never equal the fill value elsewhere.
    """
    rng = np.random.default_rng(zlib.crc32(case.path.encode()))
    dt = np.dtype(case.dtype)
    if dt.kind == "f":
        data = rng.standard_normal(case.shape).astype(dt)
    else:
        data = rng.integers(8, 250, size=case.shape).astype(dt)
    if case.shape == ():
        return np.asarray(data, dtype=dt)
    fill = fill_scalar(case)
    if not case.sharded:
        # blank one chunk so the unsharded arrays have an absent chunk too
        data[tuple(slice(0, c) for c in case.chunk)] = fill
        return data
    shard = case.chunk
    leaf = leaf_shape(case)
    shard_grid = [math.ceil(s / c) for s, c in zip(case.shape, shard)]
    per_shard = [c // l for c, l in zip(shard, leaf)]
    shard_coords = list(product(*[range(g) for g in shard_grid]))

    def blank_shard(sc):
        data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(sc, shard))] = fill

    def blank_leaf(sc, flat):
        local = np.unravel_index(flat, per_shard)
        data[tuple(slice(i * c + l * lf, i * c + (l + 1) * lf)
                   for i, c, l, lf in zip(sc, shard, local, leaf))] = fill

    n_leaf = math.prod(per_shard)
    if len(shard_coords) >= 3:
        blank_shard(shard_coords[1])
        if case.nested is not None:
            # a whole outer inner chunk of fill: an empty entry in the outer index
            sc = shard_coords[2]
            data[tuple(slice(i * c, i * c + n) for i, c, n in zip(sc, shard, case.inner))] = fill
    if n_leaf >= 2:
        blank_leaf(shard_coords[0], 1)
        if len(shard_coords) >= 3:
            blank_leaf(shard_coords[2], n_leaf - 1)
    return data


# ----------------------------------------------------------------------------------------------
# writers


def _write_groups(root: Path, writer: str) -> None:
    import zarr

    for gpath, attrs in GROUPS.items():
        attrs = dict(attrs)
        if gpath == "":
            attrs["writer"] = writer
        zarr.open_group(str(root / gpath) if gpath else str(root), mode="w", zarr_format=3,
                        attributes=attrs)


def _zarr_codec_objects(case: Case):
    from zarr.codecs import ShardingCodec, TransposeCodec

    cfg = sharding_json(case)["configuration"]
    serializer = ShardingCodec(chunk_shape=tuple(cfg["chunk_shape"]), codecs=cfg["codecs"],
                               index_codecs=cfg["index_codecs"], index_location=cfg["index_location"])
    filters = [TransposeCodec(order=case.transpose)] if case.transpose is not None else []
    return serializer, filters


def write_array_zarr_python(root: Path, case: Case, data: np.ndarray) -> None:
    import zarr
    from zarr.codecs import BytesCodec, GzipCodec, TransposeCodec

    common = dict(name=case.path, shape=case.shape, dtype=case.dtype, fill_value=fill_scalar(case),
                  attributes=dict(case.attributes), chunk_key_encoding=case.cke,
                  dimension_names=case.dimension_names)
    default_layout = (case.index_endian == "little" and case.index_crc and case.index_location == "end"
                      and case.transpose is None and case.nested is None and case.data_endian == "little"
                      and case.stored_as_is != "bytes_after" and case.shape != ())
    if not case.sharded:
        arr = zarr.create_array(str(root), chunks=case.chunk,
                                filters=[TransposeCodec(order=case.transpose)] if case.transpose else [],
                                serializer=BytesCodec(endian=case.data_endian),
                                compressors=compressor_json(case) or None, **common)
    elif default_layout:
        # the everyday API: chunks = inner chunk, shards = shard shape
        arr = zarr.create_array(str(root), chunks=case.inner, shards=case.chunk,
                                compressors=compressor_json(case) or None, **common)
    else:
        serializer, filters = _zarr_codec_objects(case)
        arr = zarr.create_array(str(root), chunks=case.chunk, serializer=serializer, filters=filters,
                                compressors=[GzipCodec(level=5)] if case.stored_as_is == "bytes_after"
                                else None, **common)
    if case.sharded and case.shape == ():
        # zarr-python 3.1.6 cannot write a 0-d sharded array (IndexError in the sharding codec's
        # partial encode); the metadata is zarr-python's, the shard is written by tensorstore.
        import tensorstore as ts

        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / case.path)}},
                    open=True).result()
        t[...].write(data).result()
        return
    arr[...] = data


def _array_meta_json(case: Case) -> dict:
    meta = {"data_type": case.dtype, "shape": list(case.shape),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(case.chunk)}},
            "codecs": codecs_json(case), "fill_value": case.fill}
    if case.cke is not None:
        meta["chunk_key_encoding"] = copy.deepcopy(case.cke)
    if case.attributes:
        meta["attributes"] = copy.deepcopy(case.attributes)
    if case.dimension_names is not None:
        meta["dimension_names"] = list(case.dimension_names)
    return meta


def write_array_tensorstore(root: Path, case: Case, data: np.ndarray) -> None:
    import tensorstore as ts

    written = case
    if case.stored_as_is == "bytes_after":
        # tensorstore refuses [sharding_indexed, gzip]: write sharded, then gzip every shard
        written = dataclasses.replace(case, stored_as_is=None)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / case.path)},
            "metadata": _array_meta_json(written)}
    arr = ts.open(spec, create=True, delete_existing=True).result()
    arr[...].write(data).result()
    if case.stored_as_is == "bytes_after":
        adir = root / case.path
        for p in sorted((adir / "c").rglob("*")):
            if p.is_file():
                p.write_bytes(gzip.compress(p.read_bytes(), compresslevel=5, mtime=0))
        meta = json.loads((adir / "zarr.json").read_text())
        meta["codecs"].append(copy.deepcopy(GZIP))
        (adir / "zarr.json").write_text(json.dumps(meta, indent=2))


def _post_edit(root: Path, case: Case) -> None:
    adir = root / case.path
    if case.stored_as_is == "storage_transformer" or case.extra_json:
        meta = json.loads((adir / "zarr.json").read_text())
        if case.stored_as_is == "storage_transformer":
            meta["storage_transformers"] = [{"name": "zvfs_test_transformer",
                                             "configuration": {"note": "made up"}}]
        if case.extra_json:
            meta.update(copy.deepcopy(case.extra_json))
        (adir / "zarr.json").write_text(json.dumps(meta, indent=2))


def write_store(directory: str | os.PathLike, writer: str, unsharded: bool = False,
                cases: list[Case] | None = None) -> list[ArrayInfo]:
    """Write the catalogue with ``writer`` ("zarr-python" or "tensorstore") into ``directory``.

    ``unsharded=True`` writes the twin: every unshardable array written with chunk = innermost
    chunk and codecs = [transpose] + inner codecs (arrays that are shown as stored are left out).
    Groups are always written by zarr-python; consolidated metadata is added last.
    """
    import zarr

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    _write_groups(root, writer)
    out = []
    for case in (CASES if cases is None else cases):
        data = make_data(case)
        wcase = case
        if unsharded:
            if case.stored_as_is:
                continue
            wcase = unsharded_case(case)
        if writer == "zarr-python":
            write_array_zarr_python(root, wcase, data)
        elif writer == "tensorstore":
            write_array_tensorstore(root, wcase, data)
        else:
            raise ValueError(writer)
        _post_edit(root, wcase)
        out.append(ArrayInfo(case=case, path=case.path, data=data, directory=root / case.path))
    for g in CONSOLIDATED_GROUPS:
        zarr.consolidate_metadata(str(root / g))
    return out


def write_zarr_python_store(directory) -> list[ArrayInfo]:
    return write_store(directory, "zarr-python")


def write_tensorstore_store(directory) -> list[ArrayInfo]:
    return write_store(directory, "tensorstore")


def write_crc_store(directory) -> list[ArrayInfo]:
    """A small store with one crc32c-indexed array (3x3 shards), for the corruption test."""
    case = Case("crc/arr", dtype="uint16", compressor="gzip", **S2)
    import zarr

    root = Path(directory)
    zarr.open_group(str(root), mode="w", zarr_format=3, attributes={})
    zarr.open_group(str(root / "crc"), mode="w", zarr_format=3, attributes={})
    data = make_data(case)
    write_array_zarr_python(root, case, data)
    return [ArrayInfo(case=case, path=case.path, data=data, directory=root / case.path)]
