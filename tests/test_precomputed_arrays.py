"""zvfs.formats.precomputed_array without FUSE: precomputed volume scales as ArrayModels.

Writers: tensorstore's `neuroglancer_precomputed` driver writes every fixture volume
(`writers_precomputed.array_datasets`: raw and compressed_segmentation, uint8/16/32/64, 1 and
2 channels, unsharded and sharded with both hashes and both encodings, partial edge chunks,
chunks never written); cloud-volume writes `.gz` chunk files; tensorstore's sharded kvstore
writes hostile chunk bytes at chosen ids. Reader of the truth: tensorstore's precomputed
driver on the original. Every chunk goes through the path the views use (`locate` or a
listing's `ref`, then `RangeFile`: read, decode, decoded cache).
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import writers_precomputed as wp  # noqa: E402

from zvfs.errors import CorruptShardError  # noqa: E402
from zvfs.formats import precomputed as pc  # noqa: E402
from zvfs.formats.array import ArrayModel  # noqa: E402
from zvfs.formats.precomputed_array import volume_hierarchy  # noqa: E402
from zvfs.storage.cache import CoalescingCache, decoded_size  # noqa: E402
from zvfs.storage.local import LocalStore  # noqa: E402
from zvfs.tree.nodes import RangeFile  # noqa: E402

DATASETS = {ds.name: ds for ds in wp.array_datasets()}
SCALES = wp.scales_of(DATASETS)
SCALE_IDS = wp.scale_ids(DATASETS)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    return wp.write_datasets(tmp_path_factory.mktemp("pa"), DATASETS)


@pytest.fixture(scope="module")
def cv_env(tmp_path_factory):
    with wp.cloudvolume_env(tmp_path_factory.mktemp("cv-env")):
        yield


def caches():
    return CoalescingCache(1 << 24), CoalescingCache(1 << 24, decoded_size)


async def open_hierarchy(path: Path):
    store = LocalStore(str(path))
    cache, decoded = caches()
    return store, volume_hierarchy(store, await pc.load_dataset(store), cache, decoded), decoded


async def read_chunk(store, ref, decoded) -> bytes:
    f = RangeFile(1, store, ref, decoded)
    size = await f.size()
    data = await read_opened(f, size + 1)
    assert len(data) == size
    return data


async def read_opened(f: RangeFile, size: int) -> bytes:
    """What an open and one read of `size` bytes give (a mount's open: a snapshot)."""
    handle = await f.open()
    try:
        return await handle.read(0, size)
    finally:
        handle.release()


def original(root: Path, name: str, i: int) -> np.ndarray:
    """The whole scale as tensorstore's precomputed driver reads it, (x, y, z, channel)."""
    return np.asarray(wp.ts_open(root / name, DATASETS[name].scales[i].key).read().result())


def cells_written(ds: wp.TsDataset, scale: wp.TsScale) -> set[tuple[int, int, int, int]]:
    grid = [-(-s // c) for s, c in zip(scale.size, scale.chunk_size)]
    return {(*c, 0) for c in np.ndindex(*grid)} - {(*c, 0) for c in scale.zero_cells}


# ----------------------------------------------------------------------------------------------
# the model


async def test_hierarchy_has_one_array_per_scale(written):
    for name, ds in DATASETS.items():
        info = json.loads((written / name / "info").read_text())
        store, h, _ = await open_hierarchy(written / name)
        try:
            assert h[""].children == [s["key"] for s in info["scales"]]
            assert sorted(h) == sorted(["", *(s["key"] for s in info["scales"])])
        finally:
            await store.aclose()


@pytest.mark.parametrize("sc", SCALES, ids=SCALE_IDS)
async def test_array_model_follows_the_info_file(written, sc):
    name, i = sc
    ds = DATASETS[name]
    info = json.loads((written / name / "info").read_text())
    meta, first = info["scales"][i], info["scales"][0]
    store, h, _ = await open_hierarchy(written / name)
    try:
        a = h[meta["key"]]
        assert isinstance(a, ArrayModel) and a.warning is None
        assert a.shape == (*meta["size"], info["num_channels"])
        assert a.chunk_shape == (*meta["chunk_sizes"][0], info["num_channels"])
        assert a.data_type == info["data_type"] == ds.dtype
        assert a.dimension_names == ("x", "y", "z", "channel")
        assert a.codecs == [{"name": "transpose", "configuration": {"order": [3, 2, 1, 0]}},
                            {"name": "bytes", "configuration": {"endian": "little"}}]
        assert a.cropped_edges and a.fill_value == 0 and a.separator == "/"
        assert a.version is not None and a.version.size == (written / name / "info").stat().st_size
        attrs = a.attributes
        assert attrs["resolution"] == meta["resolution"]
        assert attrs["voxel_offset"] == meta["voxel_offset"]
        assert attrs["pixelResolution"] == {"unit": "nm", "dimensions": meta["resolution"]}
        assert attrs["downsamplingFactors"] == [r / r0 for r, r0 in zip(meta["resolution"], first["resolution"])]
        assert a.chunks.grid == (*(-(-s // c) for s, c in zip(meta["size"], meta["chunk_sizes"][0])), 1)
    finally:
        await store.aclose()


async def test_datasets_without_volume_arrays(tmp_path):
    """Annotations have no array form; skeletons and meshes beside a volume are left out;
    an encoding without a decoder here, or data its format cannot hold, is a warning on its
    array (spec-built info files)."""
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "info").write_text(json.dumps({
        "@type": "neuroglancer_annotations_v1", "dimensions": {"x": [1, "nm"]}, "lower_bound": [0], "upper_bound": [10],
        "annotation_type": "POINT", "properties": [], "relationships": [], "by_id": {"key": "by_id"}, "spatial": []}))
    (tmp_path / "vol").mkdir()
    scale = {"key": "s0", "size": [64, 64, 64], "voxel_offset": [0, 0, 0], "chunk_sizes": [[64, 64, 64]], "resolution": [1, 1, 1]}
    (tmp_path / "vol" / "info").write_text(json.dumps({
        "@type": "neuroglancer_multiscale_volume", "type": "image", "data_type": "uint8", "num_channels": 3,
        "mesh": "mesh", "skeletons": "skeletons",
        "scales": [{**scale, "encoding": "compresso"}, {**scale, "key": "s1", "encoding": "raw"},
                   {**scale, "key": "s2", "encoding": "jpeg"}, {**scale, "key": "s3", "encoding": "png"}]}))
    (tmp_path / "vol2").mkdir()  # jpeg has 1 or 3 channels
    (tmp_path / "vol2" / "info").write_text(json.dumps({
        "@type": "neuroglancer_multiscale_volume", "type": "image", "data_type": "uint8", "num_channels": 2,
        "scales": [{**scale, "encoding": "jpeg"}, {**scale, "key": "s1", "encoding": "png"}]}))
    for sub in ("ann", "vol", "vol2"):
        store, h, _ = await open_hierarchy(tmp_path / sub)
        try:
            if sub == "ann":
                assert list(h) == [""] and h[""].children == []
            elif sub == "vol":
                assert h[""].children == ["s0", "s1", "s2", "s3"] and sorted(h) == ["", "s0", "s1", "s2", "s3"]
                assert "compresso" in h["s0"].warning and [h[k].warning for k in ("s1", "s2", "s3")] == [None] * 3
            else:
                assert "jpeg" in h["s0"].warning and h["s1"].warning is None
        finally:
            await store.aclose()


# ----------------------------------------------------------------------------------------------
# every chunk, every listing


@pytest.mark.parametrize("sc", SCALES, ids=SCALE_IDS)
async def test_every_chunk_equals_tensorstore(written, sc):
    name, i = sc
    ds, scale = DATASETS[name], DATASETS[name].scales[i]
    want = original(written, name, i)
    stored = cells_written(ds, scale)
    passes = scale.encoding == "raw" and (scale.sharding is None or scale.sharding["data_encoding"] == "raw")
    store, h, decoded = await open_hierarchy(written / name)
    try:
        a = h[scale.key]
        for cell in np.ndindex(*a.chunks.grid):
            ref = await a.chunks.locate(cell)
            ext = a.chunk_extent(cell)
            region = want[tuple(slice(c * k, c * k + e) for c, k, e in zip(cell, a.chunk_shape, ext))]
            if cell not in stored:
                assert ref is None, cell
                assert not region.any()  # tensorstore reads the fill value there
                continue
            assert ref is not None, cell
            assert (ref.decode is None) == passes, cell
            data = await read_chunk(store, ref, decoded)
            assert len(data) == math.prod(ext) * np.dtype(ds.dtype).itemsize
            got = np.frombuffer(data, dtype=np.dtype(ds.dtype).newbyteorder("<")).reshape(ext, order="F")
            np.testing.assert_array_equal(got, region, err_msg=f"{name}:{scale.key} chunk {cell}")
        for outside in ((*a.chunks.grid[:3], 0), (0, 0, 0, 1), (-1, 0, 0, 0), (0, 0, 0)):
            assert await a.chunks.locate(outside) is None
    finally:
        await store.aclose()


@pytest.mark.parametrize("sc", SCALES, ids=SCALE_IDS)
async def test_listings_hold_exactly_the_written_chunks(written, sc):
    name, i = sc
    ds, scale = DATASETS[name], DATASETS[name].scales[i]
    store, h, decoded = await open_hierarchy(written / name)
    try:
        a = h[scale.key]
        tables = await a.chunks.tables({})
        seen = []
        for t in tables:
            coords = t.coords.tolist()
            assert coords == sorted(coords)  # C order
            for row, c in enumerate(coords):
                ref, located = t.ref(row), await a.chunks.locate(tuple(c))
                assert (ref.key, ref.offset, ref.length, ref.decode is None) == \
                    (located.key, located.offset, located.length, located.decode is None)
                assert int(t.lengths[row]) == ref.length
                assert await read_chunk(store, ref, decoded) == await read_chunk(store, located, decoded)
            seen += [tuple(c) for c in coords]
        assert len(seen) == len(set(seen))
        assert set(seen) == cells_written(ds, scale)
        shard_files = sorted(p.name for p in (written / name / scale.key).iterdir())
        if scale.sharding:
            assert len(tables) == len(shard_files) and all(f.endswith(".shard") for f in shard_files)
            assert {t.key for t in tables} == {f"{scale.key}/{f}" for f in shard_files}
        else:
            assert len(tables) == 1 and sorted(k.rpartition("/")[2] for k in tables[0].keys) == shard_files
        # with a fixed coordinate: the tables hold at least every stored chunk that has it
        rows = {tuple(c) for t in await a.chunks.tables({0: 1}) for c in t.coords.tolist() if c[0] == 1}
        assert rows == {c for c in cells_written(ds, scale) if c[0] == 1}
    finally:
        await store.aclose()


async def test_gz_chunk_files_written_by_cloud_volume(tmp_path, cv_env):
    """Unsharded scales may hold `<name>.gz` files (cloud-volume with compress='gzip'):
    decoded, and a plain file of the same name wins."""
    from cloudvolume import CloudVolume

    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (20, 12, 6, 1), dtype=np.uint8)
    info = CloudVolume.create_new_info(num_channels=1, layer_type="image", data_type="uint8", encoding="raw",
                                       resolution=[4, 4, 40], voxel_offset=[3, -4, 1], chunk_size=[8, 8, 4],
                                       volume_size=[20, 12, 6])
    vol = CloudVolume("file://" + str(tmp_path), info=info, progress=False, compress="gzip")
    vol.commit_info()
    vol[3:23, -4:8, 1:7] = data
    key = vol.info["scales"][0]["key"]
    gz = sorted(p.name for p in (tmp_path / key).iterdir())
    assert gz and all(n.endswith(".gz") for n in gz)
    plain_name = gz[0][:-3]
    (tmp_path / key / plain_name).write_bytes(zlib.decompress((tmp_path / key / gz[0]).read_bytes(), 31))
    store, h, decoded = await open_hierarchy(tmp_path)
    try:
        a = h[key]
        tables = await a.chunks.tables({})
        assert sum(len(t.coords) for t in tables) == len(gz) == math.prod(a.chunks.grid)
        for t in tables:
            for row in range(len(t.coords)):
                cell = tuple(t.coords[row].tolist())
                ref = t.ref(row)
                assert ref.key.endswith(".gz") == (ref.key.rpartition("/")[2] != plain_name)
                ext = a.chunk_extent(cell)
                got = np.frombuffer(await read_chunk(store, ref, decoded), np.uint8).reshape(ext, order="F")
                want = data[tuple(slice(c * k, c * k + e) for c, k, e in zip(cell, a.chunk_shape, ext))]
                np.testing.assert_array_equal(got, want)
                assert (await a.chunks.locate(cell)).key == ref.key
    finally:
        await store.aclose()


# ----------------------------------------------------------------------------------------------
# hostile input: CorruptShardError for that chunk, bounded memory, never a crash


def gzip_bomb(nbytes: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([c.compress(block) for _ in range(nbytes >> 20)] + [c.flush()])


async def expect_corrupt(store, ref, decoded, peak_limit=16 << 20):
    tracemalloc.start()
    try:
        with pytest.raises(CorruptShardError):
            await read_chunk(store, ref, decoded)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < peak_limit, peak


def copy_dataset(written: Path, name: str, dest: Path) -> Path:
    shutil.copytree(written / name, dest)
    return dest


async def test_gzip_bomb_in_a_shard(written, tmp_path):
    """A gzip-encoded shard chunk that inflates to 60 MiB (its chunk holds 2 KiB)."""
    import tensorstore as ts

    root = copy_dataset(written, "pa_u64", tmp_path / "ds")
    info = json.loads((root / "info").read_text())
    scale = next(s for s in info["scales"] if s["key"] == "16_16_16")
    spec = dict(scale["sharding"], data_encoding="raw")  # the bytes go in as they are ...
    shutil.rmtree(root / "16_16_16")
    bomb = gzip_bomb(60 << 20)
    assert len(bomb) < 2 * 8 * 8 * 4 * 8 + (64 << 10)  # ... small enough to be fetched
    kv = ts.KvStore.open({"driver": "neuroglancer_uint64_sharded", "base": f"file://{root}/16_16_16/", "metadata": spec}).result()
    kv[struct.pack(">Q", 0)] = bomb  # cell (0, 0, 0)
    store, h, decoded = await open_hierarchy(root)  # ... and the info still says gzip
    try:
        ref = await h["16_16_16"].chunks.locate((0, 0, 0, 0))
        assert ref is not None and ref.length == len(bomb)
        await expect_corrupt(store, ref, decoded)
        t = (await h["16_16_16"].chunks.tables({}))[0]
        await expect_corrupt(store, t.ref(0), CoalescingCache(1 << 24, decoded_size))
    finally:
        await store.aclose()


async def test_gzip_bomb_and_oversized_gz_files(written, tmp_path):
    root = copy_dataset(written, "pa_u64", tmp_path / "ds")
    d = root / "32_32_32"
    files = sorted(p for p in d.iterdir())
    files[0].unlink()
    Path(str(files[0]) + ".gz").write_bytes(gzip_bomb(60 << 20))  # fetched, inflation stopped
    files[1].unlink()
    Path(str(files[1]) + ".gz").write_bytes(bytes(200 << 10))  # longer than any chunk: not even fetched
    files[2].write_bytes(files[2].read_bytes()[:-8])  # a raw chunk 8 bytes short
    store, h, decoded = await open_hierarchy(root)
    try:
        a = h["32_32_32"]
        table = (await a.chunks.tables({}))[0]
        by_name = {k.rpartition("/")[2]: row for row, k in enumerate(table.keys)}
        for f in (files[0].name + ".gz", files[1].name + ".gz", files[2].name):
            row = by_name[f]
            await expect_corrupt(store, table.ref(row), decoded)
            await expect_corrupt(store, await a.chunks.locate(tuple(table.coords[row].tolist())), decoded)
    finally:
        await store.aclose()


async def stored_chunks(written: Path, name: str, key: str):
    """(ref, stored bytes, decoded bytes) of every stored chunk of a scale."""
    store, h, decoded = await open_hierarchy(written / name)
    try:
        out = []
        for t in await h[key].chunks.tables({}):
            for row in range(len(t.coords)):
                ref = t.ref(row)
                raw = await store.read(ref.key, ref.offset, ref.length)
                out.append((ref, raw, ref.decode(raw)))
        return out
    finally:
        await store.aclose()


@pytest.mark.parametrize("name,key", [("pa_u32", "12_12_30"), ("pa_seg2", "1_1_1"), ("pa_u64", "8_8_8")])
async def test_truncated_compressed_segmentation(written, name, key):
    """Every truncation is refused or, where the decoder never reads the lost words, decodes
    to the same chunk: never a crash, never other bytes."""
    chunks = await stored_chunks(written, name, key)
    refused = 0
    for ref, raw, good in chunks[:6]:
        if name == "pa_u64":
            raw = zlib.decompress(raw, 31)  # this scale is gzip-encoded in its shards
        for n in range(0, len(raw)):
            try:
                out = ref.decode(_encoded(name, raw[:n]))
            except CorruptShardError:
                refused += 1
                continue
            assert out == good, n
    assert refused > 0


def _encoded(name: str, cs: bytes) -> bytes:
    return zlib.compress(cs, wbits=31) if name == "pa_u64" else cs


@pytest.mark.parametrize("name,key", [("pa_u32", "12_12_30"), ("pa_seg2", "1_1_1")])
async def test_lying_compressed_segmentation_headers(written, name, key):
    chunks = await stored_chunks(written, name, key)
    ref, raw, good = max(chunks, key=lambda c: len(c[1]))
    words = np.frombuffer(raw, "<u4")
    nch = DATASETS[name].num_channels
    o = int(words[0])

    def mutated(at: int, value: int) -> bytes:
        w = words.copy()
        w[at] = value
        return w.tobytes()

    lies = [
        mutated(0, 2**32 - 1),  # channel offset past the end
        mutated(0, 0),  # channel data overlapping the offsets
        mutated(o, (words[o] & 0xFF000000) | 0xFFFFFF),  # table offset past the end
        mutated(o + 1, 2**32 - 1),  # encoded values past the end
        mutated(o, (words[o] & 0xFFFFFF) | (32 << 24)),  # 32-bit values (the package decodes them wrongly)
        mutated(o, (words[o] & 0xFFFFFF) | (3 << 24)),  # bits not in the format
        mutated(o, (words[o] & 0xFFFFFF) | (255 << 24)),
        raw + b"\x01",  # not whole words
    ]
    if nch > 1:
        lies.append(mutated(1, 2**31))
    for lie in lies:
        with pytest.raises(CorruptShardError):
            ref.decode(lie)
    # random single-word lies: refused, or a chunk of the right size (labels may differ)
    rng = np.random.default_rng(11)
    for _ in range(3000):
        w = words.copy()
        at = int(rng.integers(0, min(len(w), o + 64)))
        w[at] = int(rng.integers(0, 2**32)) if rng.random() < 0.5 else int(w[at]) ^ (1 << int(rng.integers(0, 32)))
        try:
            out = ref.decode(w.tobytes())
        except CorruptShardError:
            continue
        assert len(out) == len(good)


@pytest.mark.parametrize("name,key", [("pa_jpeg", "2_2_1"), ("pa_gray", "1_1_1"), ("pa_png16", "6_6_6")])
async def test_lying_and_damaged_images(written, name, key):
    """An image whose header claims another (or a huge) size is refused before decoding; any
    damage is refused or decodes to a chunk of the right size; memory stays bounded."""
    ref, raw, good = max(await stored_chunks(written, name, key), key=lambda c: len(c[1]))
    huge = bytearray(raw)
    if raw.startswith(b"\x89PNG"):
        huge[16:24] = struct.pack(">II", 60000, 60000)  # IHDR width, height
    else:
        sof = raw.index(b"\xff\xc0")
        huge[sof + 5 : sof + 9] = struct.pack(">HH", 65000, 65000)  # SOF0 height, width
    other = bytearray(huge)
    if raw.startswith(b"\x89PNG"):
        other[16:24] = raw[20:24] + raw[16:20]  # width and height swapped
    else:
        other[sof + 5 : sof + 9] = raw[sof + 7 : sof + 9] + raw[sof + 5 : sof + 7]
    tracemalloc.start()
    try:
        for lie in (bytes(huge), bytes(other), raw[: len(raw) // 2], b"", b"\x00" * 64):
            with pytest.raises(CorruptShardError):
                ref.decode(lie)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    rng = np.random.default_rng(5)
    for _ in range(2000):
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        try:
            out = ref.decode(bytes(b))
        except CorruptShardError:
            continue
        assert len(out) == len(good)


# ----------------------------------------------------------------------------------------------
# decoding off the event loop


async def test_a_large_chunk_decodes_while_the_event_loop_goes_on(tmp_path):
    """A 2 MiB gzip-encoded chunk (tensorstore writes it) is decoded in a worker thread: other
    tasks of the mount keep running during the read (counted, not timed). Decoded on the event
    loop, they would not make a single step until the read returned. The bytes still equal
    tensorstore's."""
    import trio

    scale = wp.TsScale("1_1_1", (256, 128, 128), (0, 0, 0), (128, 128, 128), (1, 1, 1),
                       wp.sharding("identity", preshift=0, minishard=0, shard=0, index="raw", data="gzip"))
    ds = wp.TsDataset("big", "image", "uint8", [scale])
    ds.data.append(np.random.default_rng(3).integers(0, 256, (256, 128, 128, 1), dtype=np.uint8))
    root = wp.write_ts_dataset(tmp_path / "big", ds)
    want = np.asarray(wp.ts_open(root, scale.key).read().result())
    store, h, decoded = await open_hierarchy(root)
    try:
        a = h[scale.key]
        first, second = await a.chunks.locate((0, 0, 0, 0)), await a.chunks.locate((1, 0, 0, 0))
        assert first.decode is not None and second.decode is not None
        await read_opened(RangeFile(1, store, first, decoded), 1)  # the shard's descriptor and index are at hand now
        steps, reading = 0, True

        async def other_request():
            nonlocal steps
            while reading:
                steps += 1
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_request)
            data = await read_opened(RangeFile(2, store, second, decoded), 1 << 22)
            reading = False
        assert steps > 0, "the event loop ran nothing while the chunk decoded"
        got = np.frombuffer(data, np.uint8).reshape((128, 128, 128), order="F")
        np.testing.assert_array_equal(got, want[128:256, :, :, 0])
    finally:
        await store.aclose()
