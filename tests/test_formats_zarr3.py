"""Format layer without FUSE: sharding plans, index decoding, chunk location and listing.

Location and listing are checked against an unsharded twin written by zarr-python with the same
data and inner codecs: the bytes zvfs locates inside a shard must be exactly the twin's chunk
file, and the chunks it lists must be exactly the twin's chunk files.
"""

from __future__ import annotations

import json
import os
import struct

import crc32c
import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, TransposeCodec, ZstdCodec

from zvfs.errors import CorruptShardError, MetadataError
from zvfs.formats import zarr3
from zvfs.storage.cache import CoalescingCache
from zvfs.storage.local import LocalStore

EMPTY = 2**64 - 1


def sharded_meta(shape, shard, inner, **sharding_conf):
    conf = {"chunk_shape": list(inner), "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}
    conf.update(sharding_conf)
    return {
        "zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "sharding_indexed", "configuration": conf}],
    }


# --------------------------------------------------------------------------- plans


def test_plan_single_level():
    node = zarr3.parse_array("a", sharded_meta((100, 60), (40, 40), (10, 20)), "a/zarr.json")
    assert node.warning is None
    plan = node.plan
    assert plan.chunk_shape == (10, 20)
    assert plan.shard_shape == (40, 40)
    (level,) = plan.levels
    assert level.grid == (4, 2)
    assert level.index_nbytes == 16 * 8 + 4  # default index codecs: bytes + crc32c
    assert plan.codecs == [{"name": "bytes", "configuration": {"endian": "little"}}]


def test_plan_nested_with_transpose():
    inner = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [2, 4], "codecs": [{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}], "index_location": "start"}}
    meta = sharded_meta((16, 8), (16, 8), (8, 4), codecs=[inner])
    meta["codecs"] = [{"name": "transpose", "configuration": {"order": [1, 0]}}] + meta["codecs"]
    plan = zarr3.parse_array("a", meta, "w").plan
    outer, nested = plan.levels
    # the outer inner shape (8, 4) is in transposed order: in array order it is (4, 8)
    assert outer.inner_shape == (4, 8) and outer.grid == (1, 4) and outer.perm == (1, 0)
    # nested shard (4, 8) is (8, 4) in the transposed order; its inner [2, 4] gives a (4, 1) grid
    assert nested.shard_shape == (4, 8) and nested.inner_shape == (4, 2) and nested.grid == (4, 1)
    assert nested.index_dtype == ">u8" and not nested.index_crc and nested.index_location == "start"
    assert plan.chunk_shape == (4, 2)
    assert plan.codecs == [{"name": "transpose", "configuration": {"order": [1, 0]}},
                           {"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}]


@pytest.mark.parametrize("edit, reason", [
    (lambda m: m["codecs"].append({"name": "gzip"}), "after sharding"),
    (lambda m: m["codecs"][0]["configuration"].update(chunk_shape=[15, 20]), "does not divide"),
    (lambda m: m.update(storage_transformers=[{"name": "x"}]), "storage transformers"),
    (lambda m: m["codecs"][0]["configuration"].update(index_codecs=[{"name": "bytes"}, {"name": "gzip"}]), "index codecs"),
])
def test_not_unshardable_is_a_warning(edit, reason):
    meta = sharded_meta((100, 60), (40, 40), (10, 20))
    edit(meta)
    node = zarr3.parse_array("a", meta, "w")
    assert node.plan is None and node.sharded
    assert reason in node.warning


@pytest.mark.parametrize("raw, problem", [
    (b"{", "malformed JSON"),
    (b"[]", "not a JSON object"),
    (json.dumps({"zarr_format": 2}).encode(), "zarr_format"),
    (json.dumps({**sharded_meta((4,), (4,), (2,)), "shape": [-1]}).encode(), "shape"),
    (json.dumps({**sharded_meta((4,), (4,), (2,)), "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [0]}}}).encode(), "chunk_shape"),
])
def test_bad_metadata_is_one_clear_error(raw, problem):
    with pytest.raises(MetadataError) as e:
        zarr3.parse_node("a", raw, "store/a/zarr.json")
    assert "store/a/zarr.json" in str(e.value) and problem in str(e.value)
    assert "\n" not in str(e.value)


def test_chunk_key_encodings():
    assert zarr3.ChunkKeyEncoding("default", "/").key((1, 23, 45)) == "c/1/23/45"
    assert zarr3.ChunkKeyEncoding("default", ".").key((1, 23)) == "c.1.23"
    assert zarr3.ChunkKeyEncoding("default", "/").key(()) == "c"
    assert zarr3.ChunkKeyEncoding("v2", ".").key((1, 23, 45)) == "1.23.45"
    assert zarr3.ChunkKeyEncoding("v2", ".").key(()) == "0"


# --------------------------------------------------------------------------- indexes


def _level(n_inner=4, crc=True, endian="<u8", location="end"):
    return zarr3.Level((8,), (8 // n_inner,), (0,), (n_inner,), location, endian, crc)


def _index(pairs, crc=True, endian="<"):
    body = np.array(pairs, dtype=f"{endian}u8").tobytes()
    return body + (struct.pack("<I", crc32c.crc32c(body)) if crc else b"")


def test_index_decodes_little_and_big_endian():
    pairs = [(0, 10), (EMPTY, EMPTY), (10, 5), (15, 1)]
    for endian in "<>":
        idx = zarr3.decode_index(_index(pairs, endian=endian), _level(endian=f"{endian}u8"), "k", 16 + 68)
        assert idx.entries.tolist()[2] == [10, 5]
        assert idx.present().tolist() == [0, 2, 3]


def test_index_crc_mismatch_is_corrupt():
    raw = bytearray(_index([(0, 10)] * 4))
    raw[3] ^= 1
    with pytest.raises(CorruptShardError, match="crc32c"):
        zarr3.decode_index(bytes(raw), _level(), "c/0", None)


def test_index_of_wrong_length_is_corrupt():
    with pytest.raises(CorruptShardError, match="expected 68"):
        zarr3.decode_index(_index([(0, 1)] * 4)[:-1], _level(), "c/0", None)


def test_entries_outside_the_shard_are_marked_bad_not_the_whole_shard():
    # shard of 30 bytes with the index (68 bytes) at its end: only [0, 30-68) ... use 100 bytes
    pairs = [(0, 10), (90, 50), (2**63, 1), (EMPTY, EMPTY)]
    idx = zarr3.decode_index(_index(pairs), _level(), "c/0", 100)
    assert idx.present().tolist() == [0]
    # index at the start: an entry overlapping the index is bad
    idx = zarr3.decode_index(_index([(0, 10), (68, 4), (EMPTY, EMPTY), (EMPTY, EMPTY)]), _level(location="start"), "c/0", 200)
    assert idx.present().tolist() == [1]


# --------------------------------------------------------------------------- against zarr-python twins


def write_pair(tmp_path, name, data, chunks, shards, *, transpose=None, index_location="end", index_codecs=None, fill=0):
    """The same data written sharded and unsharded by zarr-python (same inner codecs)."""
    inner_codecs = [BytesCodec(), ZstdCodec(level=3)]
    sharding = ShardingCodec(chunk_shape=chunks, codecs=inner_codecs, index_location=index_location,
                             index_codecs=index_codecs or [BytesCodec(), Crc32cCodec()])
    pre = [TransposeCodec(order=transpose)] if transpose else []
    twin_chunks = chunks if not transpose else tuple(chunks[transpose.index(i)] for i in range(len(chunks)))
    sharded = zarr.create_array(tmp_path / f"{name}.sharded", shape=data.shape, dtype=data.dtype, chunks=shards,
                                serializer=sharding, filters=pre, compressors=None, fill_value=fill)
    twin = zarr.create_array(tmp_path / f"{name}.twin", shape=data.shape, dtype=data.dtype, chunks=twin_chunks,
                             serializer=BytesCodec(), filters=pre, compressors=[ZstdCodec(level=3)], fill_value=fill)
    sharded[...] = data
    twin[...] = data
    return tmp_path / f"{name}.sharded", tmp_path / f"{name}.twin"


def twin_chunks(twin_dir) -> dict[tuple, bytes]:
    out = {}
    root = os.path.join(twin_dir, "c")
    for dirpath, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            out[tuple(int(p) for p in rel.split(os.sep))] = open(os.path.join(dirpath, f), "rb").read()
    return out


async def open_sharded(path):
    store = LocalStore(str(path))
    node = zarr3.parse_node("", await store.read("zarr.json"), "zarr.json")
    return zarr3.ShardedArray(node, store, CoalescingCache(1 << 20))


def sample_data(shape):
    data = (np.arange(np.prod(shape)) % 251).astype("uint16").reshape(shape)
    data[: shape[0] // 3] = 0  # whole empty inner chunks and, with these shapes, a missing shard
    return data


@pytest.mark.parametrize("case", [
    dict(shape=(50, 37), chunks=(5, 4), shards=(10, 8)),
    dict(shape=(50, 37), chunks=(5, 4), shards=(10, 8), index_location="start"),
    dict(shape=(50, 37), chunks=(5, 4), shards=(10, 8), index_codecs=[BytesCodec(endian="big")]),
    dict(shape=(20, 9, 14), chunks=(2, 3, 7), shards=(4, 9, 14)),
    dict(shape=(30, 26), chunks=(4, 5), shards=(20, 20), transpose=(1, 0)),
])
async def test_locate_and_list_match_the_unsharded_twin(tmp_path, case):
    shape = case.pop("shape")
    sharded, twin = write_pair(tmp_path, "a", sample_data(shape), **case)
    expected = twin_chunks(twin)
    array = await open_sharded(sharded)
    listed = set()
    for shard in array.shards():
        listed |= {tuple(int(v) for v in c) for c in (await array.chunks_in_shard(shard)).coords}
    assert listed == set(expected)
    store = array.store
    for coords in np.ndindex(*array.grid):
        ref = await array.locate(coords)
        if coords not in expected:
            assert ref is None, coords
            continue
        assert await store.read(ref.key, ref.offset, ref.length) == expected[coords], coords


async def test_nested_sharding_locates_the_innermost_chunks(tmp_path):
    data = sample_data((24, 16))
    nested = ShardingCodec(chunk_shape=(6, 8), codecs=[ShardingCodec(chunk_shape=(3, 4), codecs=[BytesCodec(), ZstdCodec(level=3)])])
    sharded = zarr.create_array(tmp_path / "n.sharded", shape=data.shape, dtype=data.dtype, chunks=(12, 16),
                                serializer=nested, compressors=None, fill_value=0)
    sharded[...] = data
    twin = zarr.create_array(tmp_path / "n.twin", shape=data.shape, dtype=data.dtype, chunks=(3, 4),
                             serializer=BytesCodec(), compressors=[ZstdCodec(level=3)], fill_value=0)
    twin[...] = data
    expected = twin_chunks(tmp_path / "n.twin")
    array = await open_sharded(tmp_path / "n.sharded")
    assert len(array.plan.levels) == 2 and array.plan.chunk_shape == (3, 4)
    listed = set()
    for shard in array.shards():
        listed |= {tuple(int(v) for v in c) for c in (await array.chunks_in_shard(shard)).coords}
    assert listed == set(expected)
    for coords, blob in expected.items():
        ref = await array.locate(coords)
        assert await array.store.read(ref.key, ref.offset, ref.length) == blob


async def test_one_index_read_per_shard_even_when_asked_concurrently(tmp_path):
    import trio

    sharded, twin = write_pair(tmp_path, "a", sample_data((50, 37)), chunks=(5, 4), shards=(10, 8))
    array = await open_sharded(sharded)
    reads = []
    real_read = array.store.read_version

    async def counting_read(key, start=0, length=None):
        reads.append(key)
        await trio.sleep(0.01)
        return await real_read(key, start, length)

    array.store.read_version = counting_read
    async with trio.open_nursery() as n:
        for coords in [(8, 0), (8, 1), (9, 0), (9, 1)]:  # the four chunks of shard c/4/0
            n.start_soon(array.locate, coords)
    assert reads.count("c/4/0") == 1
