"""Property-based tests: corrupted shard files and indexes of every store kind driven through
the parsers (no FUSE). The only allowed outcomes are a result that stays inside the bytes that
exist, None (absent), or CorruptShardError: no other exception, no hang, no huge allocation.
"""

from __future__ import annotations

import gzip
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zvfs.errors import CorruptShardError
from zvfs.formats import precomputed, zarr3
from zvfs.formats.zvf import ObjectReader, ZvfLevel
from zvfs.storage.base import Entry, Store, Version
from zvfs.storage.cache import CoalescingCache

SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class MemoryStore(Store):
    """Bytes in a dict: the parsers see exactly the corrupted bytes we give them."""

    display = "memory"

    def __init__(self, files: dict[str, bytes]):
        self.files = files

    async def read(self, key, start=0, length=None, extent=None, expect=None):
        data = self.files.get(key)
        if data is None:
            return None
        if start < 0:
            return data[start:]
        return data[start:] if length is None else data[start:start + length]

    async def read_version(self, key, start=0, length=None):
        data = await self.read(key, start, length)
        return data, None if data is None else Version(len(self.files[key]), ())

    async def current(self, key):
        return None if key not in self.files else Version(len(self.files[key]), ())

    async def size(self, key):
        return len(self.files[key]) if key in self.files else None

    async def list(self, prefix):
        names = {k[len(prefix) + 1:].split("/")[0] for k in self.files if k.startswith(prefix + "/")}
        return [Entry(n, False, 0) for n in sorted(names)]


def run(fn, *args):
    return trio.run(fn, *args)


def bounded_allocation(fn, limit=64 << 20):
    """fn() must not allocate more than `limit` bytes at its peak (plus what it returns)."""
    tracemalloc.start()
    try:
        return fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < limit, f"peak allocation {peak >> 20} MiB"


# --------------------------------------------------------------------------- Zarr v3 shards


def zarr_array(index_location, crc, nested=False):
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if nested:
        inner = [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2], "codecs": inner}}]
    conf = {"chunk_shape": [4, 4], "codecs": inner, "index_location": index_location,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}] + ([{"name": "crc32c"}] if crc else [])}
    meta = {"zarr_format": 3, "node_type": "array", "shape": [16, 16], "data_type": "uint8", "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
            "codecs": [{"name": "sharding_indexed", "configuration": conf}]}
    return zarr3.parse_array("a", meta, "a/zarr.json")


@SETTINGS
@given(shard=st.binary(max_size=400), location=st.sampled_from(["start", "end"]), crc=st.booleans(), nested=st.booleans())
def test_zarr_shard_bytes_never_escape(shard, location, crc, nested):
    node = zarr_array(location, crc, nested)
    store = MemoryStore({"a/c/0/0": shard})
    array = zarr3.ShardedArray(node, store, CoalescingCache(1 << 20))

    async def walk():
        for coords in np.ndindex(*array.grid):
            try:
                ref = await array.locate(coords)
            except CorruptShardError:
                continue
            if ref is not None:
                assert 0 <= ref.offset and ref.offset + ref.length <= max(len(shard), 2**63)
        table = await array.chunks_in_shard((0, 0))
        assert len(table.coords) <= array.per_shard[0] * array.per_shard[1] * (4 if nested else 1)

    bounded_allocation(lambda: run(walk))


@SETTINGS
@given(entries=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), min_size=4, max_size=4),
       container=st.one_of(st.none(), st.integers(0, 10**6)))
def test_zarr_index_entries_outside_the_shard_are_bad_not_fatal(entries, container):
    level = zarr3.Level((8,), (2,), (0,), (4,), "end", "<u8", False)
    raw = np.array(entries, dtype="<u8").tobytes()
    idx = zarr3.decode_index(raw, level, "k", container)
    hi = 2**63 if container is None else container - 64
    for i in idx.present():
        off, nb = (int(v) for v in idx.entries[i])
        assert off + nb <= max(hi, 0)


# --------------------------------------------------------------------------- precomputed


SPECS = [precomputed.ShardingSpec(0, "identity", 1, 1, enc, "raw") for enc in ("raw", "gzip")]


@SETTINGS
@given(shard=st.binary(max_size=600), spec=st.sampled_from(SPECS), ids=st.lists(st.integers(0, 2**64 - 1), max_size=8))
def test_precomputed_shard_bytes_never_escape(shard, spec, ids):
    store = MemoryStore({"s/0.shard": shard, "s/1.shard": shard})
    kv = precomputed.ShardedKV(store, "s", spec, CoalescingCache(1 << 20))

    async def walk():
        for chunk_id in ids:
            try:
                ref = await kv.locate(chunk_id)
            except CorruptShardError:
                continue
            assert ref is None or ref.offset + ref.length <= 2**63
        for shard_no in (0, 1):
            assert len(await kv.ids_in_shard(shard_no)) <= len(shard) // 24 * (2**spec.minishard_bits) + 1

    bounded_allocation(lambda: run(walk))


@SETTINGS
@given(index=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=2, max_size=2),
       table=st.lists(st.integers(0, 2**64 - 1), max_size=30), gz=st.booleans(), tail=st.binary(max_size=300))
def test_precomputed_structured_minishards(index, table, gz, tail):
    """Shard indexes and minishard indexes of the right shape with arbitrary values."""
    n = len(table) // 3 * 3
    mini = np.array(table[:n], dtype="<u8").tobytes()
    mini = gzip.compress(mini) if gz else mini
    shard = np.array(index, dtype="<u8").tobytes() + mini + tail
    spec = precomputed.ShardingSpec(0, "identity", 1, 0, "gzip" if gz else "raw", "raw")
    kv = precomputed.ShardedKV(MemoryStore({"s/0.shard": shard}), "s", spec, CoalescingCache(1 << 20))

    async def walk():
        for chunk_id in await kv.ids_in_shard(0):
            try:
                await kv.locate(int(chunk_id))
            except CorruptShardError:
                pass

    bounded_allocation(lambda: run(walk))


@SETTINGS
@given(data=st.binary(max_size=2000))
def test_gunzip_accepts_only_gzip(data):
    try:
        out = precomputed.gunzip(data, "x", "k", limit=1 << 16)
    except CorruptShardError:
        return
    assert out == gzip.decompress(data)


def test_gunzip_bomb_is_refused_without_decoding_it():
    bomb = gzip.compress(b"\0" * (64 << 20))
    with pytest.raises(CorruptShardError, match="past"):
        bounded_allocation(lambda: precomputed.gunzip(bomb, "chunk", "k", limit=1 << 20), limit=8 << 20)


@SETTINGS
@given(manifest=st.binary(max_size=300), num_lods=st.integers(0, 2**32 - 1))
def test_mesh_manifest_parser(manifest, num_lods):
    for blob in (manifest, manifest[:24] + struct.pack("<I", num_lods) + manifest[28:]):
        try:
            total = precomputed.manifest_fragment_bytes(blob, "k")
        except CorruptShardError:
            continue
        assert total >= 0


# --------------------------------------------------------------------------- ZVF manifests


@SETTINGS
@given(blob=st.binary(max_size=200), sid_ndim=st.integers(1, 4))
def test_zvf_object_manifest_decoder(blob, sid_ndim):
    level = ZvfLevel("0", sid_ndim, 3, np.dtype("<f4"), (0,) * sid_ndim, 1, False, 1)
    reader = ObjectReader(level, {"0/object_index/manifests": zarr_array("end", True)}, None, CoalescingCache(1 << 20))
    try:
        blocks = bounded_allocation(lambda: reader.blocks(blob))
    except CorruptShardError:
        return
    assert isinstance(blocks, list)


def test_zlib_is_what_gunzip_rejects():
    with pytest.raises(CorruptShardError):
        precomputed.gunzip(zlib.compress(b"abc"), "x", "k")
