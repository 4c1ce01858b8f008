"""zvfs.formats.precomputed without FUSE: hashes, Morton codes, chunk names, minishard decoding.

Shards are written by tensorstore (its `neuroglancer_uint64_sharded` kvstore for arbitrary ids,
its `neuroglancer_precomputed` driver for volumes); hash locations are cross-checked against
cloud-volume's own implementation; Morton codes against a bit-by-bit implementation of the spec
text and against the chunk ids tensorstore stores.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import writers_precomputed as wp  # noqa: E402
from zvfs.errors import CorruptShardError, MetadataError  # noqa: E402
from zvfs.formats import precomputed as pc  # noqa: E402
from zvfs.storage.cache import CoalescingCache  # noqa: E402
from zvfs.storage.local import LocalStore  # noqa: E402

MURMUR = "murmurhash3_x86_128"


@pytest.fixture(scope="session", autouse=True)
def cv_env(tmp_path_factory):
    """cloud-volume reads its cache/lock directories from the environment at import time."""
    with wp.cloudvolume_env(tmp_path_factory.mktemp("cv-env")):
        yield


def spec_of(**kw) -> pc.ShardingSpec:
    return pc.ShardingSpec.parse(wp.sharding(**kw), "test")


def new_cache():
    return CoalescingCache(1 << 22, lambda v: 0 if v is None else v.nbytes)


def morton_ref(cell, grid) -> int:
    """The spec, literally: interleave bit i of x, y, z while each dimension has bits left."""
    bits = [math.ceil(math.log2(g)) if g > 1 else 0 for g in grid]
    out, j = 0, 0
    for i in range(max(bits, default=0)):
        for d in range(len(grid)):
            if i < bits[d]:
                out |= ((cell[d] >> i) & 1) << j
                j += 1
    return out


# --------------------------------------------------------------------------- hashes and specs


def test_murmurhash3_x86_128_test_vectors():
    s = spec_of(hash=MURMUR)
    assert s.hash_id(0) == 0x4772B084E028AE41
    assert s.hash_id(1) == 0xE8BD67D616D4CE9A


def test_preshift_applies_before_the_hash():
    s = spec_of(hash=MURMUR, preshift=3)
    assert s.hash_id(7) == 0x4772B084E028AE41
    assert s.hash_id(8) == s.hash_id(15) == 0xE8BD67D616D4CE9A
    assert spec_of(hash="identity", preshift=4).hash_id(0x1234) == 0x123


def test_identity_location_bits():
    s = spec_of(hash="identity", preshift=1, minishard=2, shard=3)
    # id 0b1_011_10_1 -> >>1 = 0b1_011_10: minishard 0b10, shard 0b011, the rest ignored
    assert s.locate(0b1011101) == (0b011, 0b10)
    assert spec_of(hash="identity", minishard=0, shard=0).locate(2**64 - 1) == (0, 0)


@pytest.mark.parametrize("kw", [
    dict(hash=MURMUR, preshift=0, minishard=2, shard=3),
    dict(hash=MURMUR, preshift=5, minishard=6, shard=9),
    dict(hash="identity", preshift=2, minishard=3, shard=4),
    dict(hash=MURMUR, preshift=0, minishard=0, shard=0),
])
def test_locations_agree_with_cloudvolume(kw):
    from cloudvolume.datasource.precomputed.sharding import ShardingSpecification

    d = wp.sharding(**kw)
    ours = pc.ShardingSpec.parse(d, "t")
    theirs = ShardingSpecification.from_dict(d)
    rng = np.random.default_rng(0)
    ids = [0, 1, 2**63, 2**64 - 1] + [int(x) for x in rng.integers(0, 2**63, 300, dtype=np.int64)]
    for i in ids:
        loc = theirs.compute_shard_location(i)
        shard, mini = ours.locate(i)
        assert (ours.shard_name(shard), mini) == (loc.shard_number or "0", int(loc.minishard_number)), i


@pytest.mark.parametrize("bits,shard,name", [(0, 0, "0"), (1, 1, "1"), (4, 15, "f"), (5, 0, "00"),
                                              (5, 31, "1f"), (8, 10, "0a"), (13, 0x1ABC, "1abc")])
def test_shard_file_names(bits, shard, name):
    assert spec_of(shard=bits, minishard=0).shard_name(shard) == name


@pytest.mark.parametrize("bad", [
    {"@type": "neuroglancer_uint64_sharded_v2"},
    {"hash": "md5"},
    {"preshift_bits": -1},
    {"minishard_bits": 65},
    {"shard_bits": "3"},
    {"shard_bits": True},
    {"minishard_bits": 40, "shard_bits": 30},
    {"data_encoding": "zstd"},
    {"minishard_index_encoding": "jpeg"},
])
def test_bad_sharding_specs_are_metadata_errors(bad):
    d = wp.sharding()
    d.update(bad)
    with pytest.raises(MetadataError):
        pc.ShardingSpec.parse(d, "where")


def test_encodings_default_to_raw():
    d = {"@type": wp.SHARDED, "hash": "identity", "preshift_bits": 0, "minishard_bits": 1, "shard_bits": 1}
    s = pc.ShardingSpec.parse(d, "t")
    assert (s.minishard_index_encoding, s.data_encoding) == ("raw", "raw")


# --------------------------------------------------------------------------- Morton codes


def test_morton_example_from_the_notes():
    assert pc.morton_bits((7, 5, 3)) == (3, 3, 2)
    assert pc.morton_encode((6, 4, 2), pc.morton_bits((7, 5, 3))) == 232
    assert morton_ref((6, 4, 2), (7, 5, 3)) == 232


@pytest.mark.parametrize("grid", [(7, 5, 3), (1, 1, 1), (1, 9, 1), (16, 2, 5), (3, 1, 33), (4, 4, 2)])
def test_morton_encode_decode_over_whole_grids(grid):
    bits = pc.morton_bits(grid)
    cells = list(np.ndindex(*grid))
    codes = [pc.morton_encode(c, bits) for c in cells]
    assert codes == [morton_ref(c, grid) for c in cells]
    assert len(set(codes)) == len(cells) and max(codes) < 2 ** sum(bits)
    decoded = pc.morton_decode(np.array(codes, dtype=np.uint64), bits)
    assert [tuple(map(int, r)) for r in decoded] == cells


# --------------------------------------------------------------------------- chunk names


def test_chunk_names_with_negative_offsets_and_truncated_edges():
    s = pc.VolumeScale("s", (37, 29, 11), (-50, -5, 0), (8, 8, 4), None)
    assert s.grid == (5, 4, 3)
    assert s.chunk_name((0, 0, 0)) == "-50--42_-5-3_0-4"
    assert s.chunk_name((4, 3, 2)) == "-18--13_19-24_8-11"
    assert s.chunk_name((3, 0, 1)) == "-26--18_-5-3_4-8"
    for cell in np.ndindex(*s.grid):
        assert s.parse_chunk_name(s.chunk_name(cell)) == cell
    for bad in ["-50--42_-5-3_0-5", "-49--41_-5-3_0-4", "-10--2_-5-3_0-4", "-18--10_19-24_8-11",
                "-050--42_-5-3_0-4", "-50--42_-5-3", "-50--42_-5-3_0-4_0-1", "+-50--42_-5-3_0-4",
                "-50--42_-5-3_0-4 ", "a-b_c-d_e-f", ""]:
        assert s.parse_chunk_name(bad) is None, bad


def test_tensorstore_negative_offset_name_from_the_notes():
    s = pc.VolumeScale("s", (16, 16, 10), (-50, -5, 0), (16, 16, 10), None)
    assert s.chunk_name((0, 0, 0)) == "-50--34_-5-11_0-10"


@pytest.fixture(scope="module")
def ts_image(tmp_path_factory):
    """ts_image written sharded and unsharded by tensorstore."""
    base = tmp_path_factory.mktemp("ts")
    ds = wp.ts_datasets()[0]
    return ds, wp.write_ts_dataset(base / "sharded", ds), wp.write_ts_dataset(base / "twin", ds, unsharded=True)


def test_chunk_names_equal_tensorstore_unsharded_files(ts_image):
    ds, _, twin = ts_image
    info = json.loads((twin / "info").read_text())
    for scale, s in zip(pc.parse_scales(info, "t"), ds.scales):
        present = [c for c in np.ndindex(*scale.grid) if c not in s.zero_cells]
        assert {scale.chunk_name(c) for c in present} == set(os.listdir(twin / s.key))


async def test_volume_chunk_ids_and_bytes_against_tensorstore_shards(ts_image):
    """Volume chunk ids are Morton codes; located bytes (decoded) equal tensorstore's unsharded files."""
    ds, sharded, twin = ts_image
    store = LocalStore(str(sharded))
    try:
        info = json.loads((sharded / "info").read_text())
        for scale, s in zip(pc.parse_scales(info, "t"), ds.scales):
            kv = pc.ShardedKV(store, scale.key, scale.sharding, new_cache())
            present = [c for c in np.ndindex(*scale.grid) if c not in s.zero_cells]
            ids = await kv.all_ids()
            assert sorted(int(i) for i in ids) == sorted(morton_ref(c, scale.grid) for c in present)
            for cell in np.ndindex(*scale.grid):
                ref = await kv.get_ref(morton_ref(cell, scale.grid))
                if cell in s.zero_cells:
                    assert ref is None
                    continue
                raw = await store.read(ref.key, ref.offset, ref.length)
                data = ref.decode(raw) if ref.decode else raw
                assert data == (twin / s.key / scale.chunk_name(cell)).read_bytes(), cell
    finally:
        await store.aclose()


# --------------------------------------------------------------------------- arbitrary ids via tensorstore


def ts_kv_write(path: Path, spec: dict, items: dict[int, bytes]) -> None:
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "neuroglancer_uint64_sharded", "base": f"file://{path}/",
                          "metadata": spec}).result()
    with ts.Transaction() as txn:
        for k, v in items.items():
            kv.with_transaction(txn)[struct.pack(">Q", k)] = v


def some_items(n=200, seed=0) -> dict[int, bytes]:
    rng = np.random.default_rng(seed)
    ids = {0, 1, 2, 2**63, 2**64 - 1} | {int(x) for x in rng.integers(0, 2**63, n, dtype=np.int64)}
    ids |= {int(x) for x in rng.integers(0, 5000, n)}
    return {i: (b"v%d|" % i) * int(rng.integers(0, 20)) for i in ids}


KV_SPECS = [
    dict(hash=MURMUR, preshift=0, minishard=2, shard=3, index="gzip", data="gzip"),
    dict(hash=MURMUR, preshift=3, minishard=3, shard=5, index="raw", data="raw"),
    dict(hash="identity", preshift=2, minishard=1, shard=2, index="gzip", data="raw"),
    dict(hash="identity", preshift=0, minishard=0, shard=0, index="raw", data="gzip"),
]


@pytest.mark.parametrize("kw", KV_SPECS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
async def test_minishard_decoding_against_tensorstore_kvstore(tmp_path, kw):
    items = some_items()
    d = wp.sharding(**kw)
    ts_kv_write(tmp_path, d, items)
    spec = pc.ShardingSpec.parse(d, "t")
    store = LocalStore(str(tmp_path))
    try:
        kv = pc.ShardedKV(store, "", spec, new_cache())
        files = sorted(os.listdir(tmp_path))
        assert [f"{spec.shard_name(s)}.shard" for s in await kv.shards()] == files
        assert [int(i) for i in await kv.all_ids()] == sorted(items)
        for k, v in items.items():
            ref = await kv.get_ref(k)
            assert ref is not None, k
            raw = await store.read(ref.key, ref.offset, ref.length)
            assert (ref.decode(raw) if ref.decode else raw) == v, k
            assert (ref.decode is None) == (kw["data"] == "raw")
        for absent in (3, 4, 2**64 - 2, 10**18 + 1):
            if absent not in items:
                assert await kv.get_ref(absent) is None
    finally:
        await store.aclose()


async def test_obsolete_index_data_pair_reads_like_the_shard(tmp_path):
    items = some_items(seed=4)
    d = wp.sharding(**KV_SPECS[0])
    ts_kv_write(tmp_path / "a", d, items)
    spec = pc.ShardingSpec.parse(d, "t")
    n = spec.shard_index_nbytes
    shards = sorted((tmp_path / "a").glob("*.shard"))
    assert len(shards) > 2
    for shard in shards[::2]:  # mixed: some pairs, some .shard
        raw = shard.read_bytes()
        shard.with_suffix(".index").write_bytes(raw[:n])
        shard.with_suffix(".data").write_bytes(raw[n:])
        shard.unlink()
    store = LocalStore(str(tmp_path))
    try:
        kv = pc.ShardedKV(store, "a", spec, new_cache())
        assert [int(i) for i in await kv.all_ids()] == sorted(items)
        for k, v in items.items():
            ref = await kv.get_ref(k)
            assert ref.decode(await store.read(ref.key, ref.offset, ref.length)) == v
    finally:
        await store.aclose()


async def test_corrupt_minishard_index_costs_only_its_chunks(tmp_path):
    items = some_items(seed=9)
    d = wp.sharding(**KV_SPECS[0])
    ts_kv_write(tmp_path, d, items)
    spec = pc.ShardingSpec.parse(d, "t")
    victim = next(k for k in sorted(items))
    shard, mini = spec.locate(victim)
    path = tmp_path / f"{spec.shard_name(shard)}.shard"
    raw = bytearray(path.read_bytes())
    start, end = np.frombuffer(bytes(raw[: spec.shard_index_nbytes]), dtype="<u8").reshape(-1, 2)[mini]
    base = spec.shard_index_nbytes
    raw[base + int(start): base + int(end)] = b"\x1f\x8b" + b"\0" * (int(end - start) - 2)
    path.write_bytes(bytes(raw))
    lost = {k for k in items if spec.locate(k) == (shard, mini)}
    store = LocalStore(str(tmp_path))
    try:
        kv = pc.ShardedKV(store, "", spec, new_cache())
        for k in lost:
            with pytest.raises(CorruptShardError):
                await kv.get_ref(k)
        assert {int(i) for i in await kv.all_ids()} == set(items) - lost
        for k in sorted(set(items) - lost)[:50]:
            ref = await kv.get_ref(k)
            assert ref.decode(await store.read(ref.key, ref.offset, ref.length)) == items[k]
    finally:
        await store.aclose()


async def test_short_shard_index_is_corrupt(tmp_path):
    d = wp.sharding(hash="identity", minishard=2, shard=0, index="raw", data="raw")
    ts_kv_write(tmp_path, d, {5: b"x"})
    (tmp_path / "0.shard").write_bytes((tmp_path / "0.shard").read_bytes()[:20])
    store = LocalStore(str(tmp_path))
    try:
        kv = pc.ShardedKV(store, "", pc.ShardingSpec.parse(d, "t"), new_cache())
        with pytest.raises(CorruptShardError):
            await kv.get_ref(5)
        assert len(await kv.all_ids()) == 0
    finally:
        await store.aclose()


# --------------------------------------------------------------------------- gunzip limits


def test_gunzip_roundtrip_and_limit_edges():
    payload = os.urandom(1000)
    z = gzip.compress(payload)
    assert pc.gunzip(z, "x", "k") == payload
    assert pc.gunzip(z, "x", "k", limit=1000) == payload  # exactly the limit is allowed
    with pytest.raises(CorruptShardError):
        pc.gunzip(z, "x", "k", limit=999)


def test_gunzip_bomb_is_refused_without_decoding_it_all():
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    assert len(bomb) < 100_000
    with pytest.raises(CorruptShardError, match="past"):
        pc.gunzip(bomb, "chunk data", "k", limit=1 << 20)


@pytest.mark.parametrize("data", [
    gzip.compress(b"hello world" * 100, mtime=0)[:-9],  # truncated trailer
    gzip.compress(b"hello world" * 100, mtime=0)[:15],  # truncated stream
    b"",
    b"not gzip at all",
    zlib.compress(b"zlib, not gzip"),
])
def test_gunzip_truncated_or_not_gzip_is_corrupt(data):
    with pytest.raises(CorruptShardError):
        pc.gunzip(data, "minishard index", "k")


# --------------------------------------------------------------------------- meshes and infos


def test_manifest_fragment_bytes_matches_cloudvolume_manifest():
    frags, manifest = wp.make_multires_mesh(5, np.random.default_rng(1))
    assert pc.manifest_fragment_bytes(manifest, "k") == len(frags)
    with pytest.raises(CorruptShardError):
        pc.manifest_fragment_bytes(manifest + b"\0", "k")
    with pytest.raises(CorruptShardError):
        pc.manifest_fragment_bytes(manifest[:-1], "k")
    with pytest.raises(CorruptShardError):
        pc.manifest_fragment_bytes(manifest[:20], "k")


def test_unsharded_info_drops_every_sharding_member():
    shard = wp.sharding()
    ann = {"@type": "neuroglancer_annotations_v1", "by_id": {"key": "by_id", "sharding": shard},
           "relationships": [{"id": "a", "key": "ra", "sharding": shard}, {"id": "b", "key": "rb"}],
           "spatial": [{"key": "s0", "grid_shape": [1, 1, 1], "sharding": shard}], "properties": []}
    assert pc.unsharded_info(ann) == {
        "@type": "neuroglancer_annotations_v1", "by_id": {"key": "by_id"},
        "relationships": [{"id": "a", "key": "ra"}, {"id": "b", "key": "rb"}],
        "spatial": [{"key": "s0", "grid_shape": [1, 1, 1]}], "properties": []}
    vol = {"type": "image", "scales": [{"key": "a", "sharding": shard, "size": [1, 1, 1]}, {"key": "b"}],
           "mesh": "m"}
    assert pc.unsharded_info(vol) == {"type": "image", "scales": [{"key": "a", "size": [1, 1, 1]}, {"key": "b"}],
                                      "mesh": "m"}
    assert pc.unsharded_info({"@type": "neuroglancer_skeletons", "sharding": shard, "x": 1}) == \
        {"@type": "neuroglancer_skeletons", "x": 1}
    assert "sharding" in json.dumps(ann)  # the input is not modified


def _write_json(p: Path, obj):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj))


async def test_load_dataset_finds_every_sharded_directory(tmp_path):
    shard = wp.sharding()
    _write_json(tmp_path / "info", {"type": "segmentation", "data_type": "uint64", "num_channels": 1,
                                    "mesh": "m", "skeletons": "sk", "scales": [
                                        {"key": "s0", "size": [10, 10, 10], "chunk_sizes": [[4, 4, 4]],
                                         "voxel_offset": [-1, 0, 0], "sharding": shard, "encoding": "raw"},
                                        {"key": "s1", "size": [5, 5, 5], "chunk_sizes": [[4, 4, 4]], "encoding": "raw"}]})
    _write_json(tmp_path / "m" / "info", {"@type": "neuroglancer_multilod_draco", "sharding": shard})
    _write_json(tmp_path / "sk" / "info", {"@type": "neuroglancer_skeletons", "sharding": shard})
    store = LocalStore(str(tmp_path))
    try:
        ds = await pc.load_dataset(store)
        assert {k: v.kind for k, v in ds.sharded.items()} == {"s0": "volume", "m": "mesh", "sk": "skeletons"}
        _write_json(tmp_path / "m" / "info", {"@type": "neuroglancer_legacy_mesh", "sharding": shard})
        with pytest.raises(MetadataError):
            await pc.load_dataset(LocalStore(str(tmp_path)))
    finally:
        await store.aclose()


async def test_load_dataset_annotations(tmp_path):
    shard = wp.sharding()
    _write_json(tmp_path / "info", {"@type": "neuroglancer_annotations_v1",
                                    "by_id": {"key": "by_id", "sharding": shard},
                                    "relationships": [{"id": "r", "key": "rel", "sharding": shard}],
                                    "spatial": [{"key": "sp", "grid_shape": [3, 2, 1], "sharding": shard},
                                                {"key": "sp2", "grid_shape": [1, 1, 1]}]})
    store = LocalStore(str(tmp_path))
    try:
        ds = await pc.load_dataset(store)
        assert ds.kind == "annotations"
        assert {k: (v.kind, v.grid_shape) for k, v in ds.sharded.items()} == {
            "by_id": ("ids", None), "rel": ("ids", None), "sp": ("spatial", (3, 2, 1))}
    finally:
        await store.aclose()


@pytest.mark.parametrize("bad", [
    {"scales": []},
    {"scales": [{"key": "../x", "size": [1, 1, 1], "chunk_sizes": [[1, 1, 1]]}]},
    {"scales": [{"key": "a", "size": [1, 1], "chunk_sizes": [[1, 1, 1]]}]},
    {"scales": [{"key": "a", "size": [1, 1, 1], "chunk_sizes": [[0, 1, 1]]}]},
    {"scales": [{"key": "a", "size": [1, 1, 1], "chunk_sizes": [[1, 1, 1]], "sharding": {"@type": "x"}}]},
])
def test_parse_scales_rejects_bad_metadata(bad):
    with pytest.raises(MetadataError):
        pc.parse_scales(bad, "info")
