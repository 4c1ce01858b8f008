"""Real FUSE mounts of sharded Neuroglancer-precomputed datasets (`neuroglancer_uint64_sharded_v1`).

Writers and readers are independent of zvfs:
- tensorstore writes sharded volumes and, with the same data and scale metadata minus `sharding`,
  the unsharded twin: its file names and bytes are what each mounted scale directory must hold;
- cloud-volume writes a sharded segmentation, sharded skeletons and sharded multiresolution
  meshes (igneous style); cloud-volume and tensorstore read the mount and the sharded original;
- annotation shards are built here by a small encoder of the spec (no writer exists).

Every expectation comes from the writers, the data put in, or the original dataset; never from
the mount itself.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import math
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import is_mounted, run_zvfs, zvfs_mount
import writers_precomputed as wp

pytestmark = pytest.mark.mount

TS = {ds.name: ds for ds in wp.ts_datasets()}
TS_SCALES = [(name, i) for name, ds in TS.items() for i in range(len(ds.scales))]


def ts_scale_id(v):
    return f"{v[0]}:{TS[v[0]].scales[v[1]].key}"


def drop_sharding(info: dict) -> dict:
    """The expected unsharded info, computed from the original (not from the mount)."""
    out = json.loads(json.dumps(info))
    out.pop("sharding", None)
    for s in out.get("scales", []):
        s.pop("sharding", None)
    for s in out.get("spatial", []):
        s.pop("sharding", None)
    for s in out.get("relationships", []):
        s.pop("sharding", None)
    if isinstance(out.get("by_id"), dict):
        out["by_id"].pop("sharding", None)
    return out


def chunk_name(cell, size, offset, chunk) -> str:
    return "_".join(f"{o + g * c}-{o + min((g + 1) * c, s)}" for g, s, o, c in zip(cell, size, offset, chunk))


def morton(cell, grid) -> int:
    """Compressed Morton code, written from the spec text (independent of zvfs)."""
    bits = [0 if g <= 1 else (int(g) - 1).bit_length() for g in grid]
    code, j = 0, 0
    for i in range(max(bits)):
        for d in range(len(grid)):
            if i < bits[d]:
                code |= ((int(cell[d]) >> i) & 1) << j
                j += 1
    return code


def shard_location(spec: dict, chunk_id: int) -> tuple[str, int]:
    """(shard file stem, minishard) by cloud-volume's own ShardingSpecification."""
    from cloudvolume.datasource.precomputed.sharding import ShardingSpecification

    loc = ShardingSpecification.from_dict(spec).compute_shard_location(chunk_id)
    return loc.shard_number, int(loc.minishard_number)


def read_eio(path: Path) -> bool:
    """True if opening/reading PATH fails with EIO."""
    try:
        path.read_bytes()
    except OSError as e:
        assert e.errno == errno.EIO, f"{path.name}: expected EIO, got {e!r}"
        return True
    return False


# ----------------------------------------------------------------------------------------------
# annotation shards: a small encoder of the spec (no writer of sharded annotations exists)


def encode_shards(spec: dict, items: dict[int, bytes], layout: str = "data_first",
                  reverse_data: bool = False, prefix: dict[int, bytes] | None = None) -> dict[str, bytes]:
    """{shard file name: bytes} for ITEMS under SPEC.

    layout "data_first": [shard index][data][minishard indexes] (igneous-like);
    layout "index_first": [shard index][minishard indexes, padded][data].
    reverse_data: data of each minishard stored in descending id order, so the delta-encoded
    offsets wrap around 2**64 (legal uint64 arithmetic).
    prefix: bytes stored immediately before an id's (encoded) data and not part of it: the
    fragment data of a multiresolution mesh, whose chunk is the manifest."""
    prefix = prefix or {}
    n_mini = 1 << spec["minishard_bits"]
    groups: dict[str, dict[int, dict[int, bytes]]] = {}
    for cid, blob in items.items():
        shard, mini = shard_location(spec, cid)
        groups.setdefault(shard, {}).setdefault(mini, {})[cid] = blob
    enc = (lambda b: gzip.compress(b, mtime=0)) if spec["data_encoding"] == "gzip" else (lambda b: b)
    ienc = (lambda b: gzip.compress(b, mtime=0)) if spec["minishard_index_encoding"] == "gzip" else (lambda b: b)
    out = {}
    for shard, minis in groups.items():
        blobs = {m: {cid: enc(b) for cid, b in sorted(g.items())} for m, g in minis.items()}
        if layout == "index_first":
            data_start = sum(24 * len(g) * 2 + 64 for g in blobs.values())  # room for the indexes
        else:
            data_start = 0
        # place data
        positions: dict[int, tuple[int, int]] = {}
        data = bytearray()
        for m in sorted(blobs):
            ids = sorted(blobs[m], reverse=reverse_data)
            for cid in ids:
                data += prefix.get(cid, b"")
                positions[cid] = (data_start + len(data), len(blobs[m][cid]))
                data += blobs[m][cid]
        # minishard indexes (ids ascending, offsets delta-encoded from the previous chunk's end)
        indexes = {}
        for m in sorted(blobs):
            ids = sorted(blobs[m])
            table = np.zeros((3, len(ids)), dtype=np.uint64)
            prev_end, prev_id = 0, 0
            for i, cid in enumerate(ids):
                start, size = positions[cid]
                table[0, i] = (cid - prev_id) % 2**64
                table[1, i] = (start - prev_end) % 2**64
                table[2, i] = size
                prev_end, prev_id = start + size, cid
            indexes[m] = ienc(table.astype("<u8").tobytes())
        shard_index = np.zeros((n_mini, 2), dtype="<u8")
        if layout == "index_first":
            body = bytearray()
            for m in sorted(indexes):
                shard_index[m] = (len(body), len(body) + len(indexes[m]))
                body += indexes[m]
            assert len(body) <= data_start
            body += b"\xa5" * (data_start - len(body))  # unreferenced filler
            body += data
        else:
            body = bytearray(data)
            for m in sorted(indexes):
                shard_index[m] = (len(body), len(body) + len(indexes[m]))
                body += indexes[m]
        out[f"{shard}.shard"] = shard_index.tobytes() + bytes(body)
    return out


ANN_BY_ID = wp.sharding("murmurhash3_x86_128", preshift=0, minishard=2, shard=2, index="gzip", data="gzip")
ANN_REL = wp.sharding("identity", preshift=1, minishard=1, shard=1, index="raw", data="raw")
ANN_SPATIAL = wp.sharding("identity", preshift=0, minishard=2, shard=1, index="gzip", data="raw")
ANN_GRID = (5, 3, 2)
ANN_CHUNK = (24, 27, 20)


def build_annotations(root: Path) -> dict:
    """A sharded POINT annotation collection; returns the expected unsharded files {rel path: bytes}."""
    rng = np.random.default_rng(99)
    n = 40
    ids = [int(x) for x in rng.choice(2**62, n - 2, replace=False)] + [3, 2**64 - 7]
    pos = rng.uniform(0, 1, (n, 3)) * np.array([120, 80, 40])
    score = rng.uniform(0, 1, n).astype("<f4")
    segs = [17, 4242, 2**40 + 1, 9]
    rel = {aid: sorted(set(int(s) for s in rng.choice(segs, int(rng.integers(0, 3)), replace=False))) for aid in ids}

    def ann(i):
        return pos[i].astype("<f4").tobytes() + score[i].tobytes()

    def multi(idx):
        return (struct.pack("<Q", len(idx)) + b"".join(ann(i) for i in idx)
                + b"".join(struct.pack("<Q", ids[i]) for i in idx))

    by_id = {}
    for i, aid in enumerate(ids):
        r = rel[aid]
        by_id[aid] = ann(i) + struct.pack("<I", len(r)) + b"".join(struct.pack("<Q", s) for s in r)
    rels = {s: multi([i for i, aid in enumerate(ids) if s in rel[aid]]) for s in segs}
    rels = {s: b for s, b in rels.items() if struct.unpack_from("<Q", b)[0]}
    cells: dict[tuple, list] = {}
    for i in range(n):
        cell = tuple(int(c) for c in np.minimum(pos[i] // np.array(ANN_CHUNK), np.array(ANN_GRID) - 1))
        cells.setdefault(cell, []).append(i)
    spatial = {cell: multi(idx) for cell, idx in cells.items()}

    info = {
        "@type": "neuroglancer_annotations_v1",
        "dimensions": {"x": [4e-9, "m"], "y": [4e-9, "m"], "z": [4e-8, "m"]},
        "lower_bound": [0, 0, 0], "upper_bound": [120, 80, 40],
        "annotation_type": "POINT", "properties": [{"id": "score", "type": "float32"}],
        "relationships": [{"id": "segments", "key": "rel_segments", "sharding": ANN_REL}],
        "by_id": {"key": "by_id", "sharding": ANN_BY_ID},
        "spatial": [
            {"key": "spatial0", "grid_shape": [1, 1, 1], "chunk_size": [120, 80, 40], "limit": 1000},
            {"key": "spatial1", "grid_shape": list(ANN_GRID), "chunk_size": list(ANN_CHUNK), "limit": 100,
             "sharding": ANN_SPATIAL},
        ],
    }
    root.mkdir(parents=True)
    (root / "info").write_text(json.dumps(info))
    for d, spec, items, kw in (
        ("by_id", ANN_BY_ID, by_id, {}),
        ("rel_segments", ANN_REL, rels, {"layout": "index_first", "reverse_data": True}),
        ("spatial1", ANN_SPATIAL, {morton(c, ANN_GRID): b for c, b in spatial.items()}, {}),
    ):
        (root / d).mkdir()
        for name, data in encode_shards(spec, items, **kw).items():
            (root / d / name).write_bytes(data)
    (root / "spatial0").mkdir()
    (root / "spatial0" / "0_0_0").write_bytes(multi(list(range(n))))
    # the obsolete pair: one by_id shard split into .index + .data
    split_shard(sorted((root / "by_id").glob("*.shard"))[0], ANN_BY_ID["minishard_bits"])

    expected = {"info": json.dumps(drop_sharding(info)).encode()}
    expected.update({f"by_id/{aid}": b for aid, b in by_id.items()})
    expected.update({f"rel_segments/{s}": b for s, b in rels.items()})
    expected.update({f"spatial1/{c[0]}_{c[1]}_{c[2]}": b for c, b in spatial.items()})
    expected["spatial0/0_0_0"] = (root / "spatial0" / "0_0_0").read_bytes()
    return {"info": info, "files": expected}


OBJ_MESH = wp.sharding("identity", preshift=0, minishard=1, shard=1, index="raw", data="gzip")
OBJ_SKEL = wp.sharding("identity", preshift=1, minishard=1, shard=2, index="gzip", data="raw")
OBJ_IDS = [1, 2, 5, 6, 9, 40, 2**50 + 3, 2**64 - 3]
OBJ_EMPTY_MESH = 9  # a mesh whose fragments are all empty


def build_objects(root: Path) -> dict:
    """Hand-built segmentation with multiresolution meshes whose manifests are gzip-encoded
    (data_encoding applies to the manifest, never to the fragments) stored in an unusual layout
    (indexes first, data of each minishard in descending id order), and skeletons with raw data.
    Returns the expected unsharded files."""
    rng = np.random.default_rng(21)
    meshes = {}
    for s in OBJ_IDS:
        meshes[s] = wp.make_multires_mesh(s, rng, empty=s == OBJ_EMPTY_MESH)
    assert meshes[OBJ_EMPTY_MESH][0] == b""
    skels = {s: wp.make_skeleton(s, rng).to_precomputed() for s in OBJ_IDS}
    info = {"@type": "neuroglancer_multiscale_volume", "type": "segmentation", "data_type": "uint64",
            "num_channels": 1, "mesh": "mesh_gz", "skeletons": "skel_raw",
            "scales": [{"key": "s", "size": [8, 8, 8], "voxel_offset": [0, 0, 0], "chunk_sizes": [[8, 8, 8]],
                        "resolution": [8, 8, 40], "encoding": "raw"}]}
    root.mkdir(parents=True)
    (root / "info").write_text(json.dumps(info))
    (root / "s").mkdir()
    chunk = np.full((8, 8, 8), 5, dtype="<u8").tobytes()
    (root / "s" / "0-8_0-8_0-8").write_bytes(chunk)
    mesh_info = {"@type": "neuroglancer_multilod_draco", "vertex_quantization_bits": wp.VERTEX_QUANTIZATION_BITS,
                 "transform": [8, 0, 0, 0, 0, 8, 0, 0, 0, 0, 40, 0], "lod_scale_multiplier": 1.0, "sharding": OBJ_MESH}
    skel_info = {"@type": "neuroglancer_skeletons", "transform": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
                 "vertex_attributes": [{"id": "radius", "data_type": "float32", "num_components": 1},
                                       {"id": "vertex_types", "data_type": "uint8", "num_components": 1}],
                 "sharding": OBJ_SKEL}
    for d, i in (("mesh_gz", mesh_info), ("skel_raw", skel_info)):
        (root / d).mkdir()
        (root / d / "info").write_text(json.dumps(i))
    files = encode_shards(OBJ_MESH, {s: m for s, (_, m) in meshes.items()}, layout="index_first",
                          reverse_data=True, prefix={s: f for s, (f, _) in meshes.items()})
    for name, data in files.items():
        (root / "mesh_gz" / name).write_bytes(data)
    for name, data in encode_shards(OBJ_SKEL, skels).items():
        (root / "skel_raw" / name).write_bytes(data)
    expected = {"info": info, "s/0-8_0-8_0-8": chunk,
                "mesh_gz/info": json.dumps(drop_sharding(mesh_info)).encode(),
                "skel_raw/info": json.dumps(drop_sharding(skel_info)).encode()}
    expected.update({f"mesh_gz/{s}.index": m for s, (_, m) in meshes.items()})
    expected.update({f"mesh_gz/{s}": f for s, (f, _) in meshes.items()})
    expected.update({f"skel_raw/{s}": b for s, b in skels.items()})
    return expected


def split_shard(shard: Path, minishard_bits: int) -> None:
    """Replace X.shard by the obsolete X.index + X.data pair it stands for."""
    raw = shard.read_bytes()
    k = 16 << minishard_bits
    shard.with_suffix(".index").write_bytes(raw[:k])
    shard.with_suffix(".data").write_bytes(raw[k:])
    shard.unlink()


# ----------------------------------------------------------------------------------------------
# session fixtures: every dataset written once, every mount made once


class Precomputed:
    def __init__(self, base: Path, stack: contextlib.ExitStack):
        self.base = base
        self.stack = stack
        self._cache: dict = {}
        self._failed: dict[str, str] = {}

    def _once(self, key, make):
        if key in self._failed:
            pytest.fail(f"{key} failed earlier in this session: {self._failed[key]}")
        if key not in self._cache:
            try:
                self._cache[key] = make()
            except BaseException as e:
                self._failed[key] = (str(e).splitlines() or [type(e).__name__])[0]
                raise
        return self._cache[key]

    def ts(self, name: str) -> Path:
        def make():
            root = wp.write_ts_dataset(self.base / "orig" / name, TS[name])
            if name == "ts_seg":
                self._cache[("extras", name)] = wp.add_passthrough_extras(root)
            return root
        return self._once(("ts", name), make)

    def extras(self, name: str) -> dict:
        self.ts(name)
        return self._cache[("extras", name)]

    def twin(self, name: str) -> Path:
        return self._once(("twin", name), lambda: wp.write_ts_dataset(self.base / "twin" / name, TS[name], unsharded=True))

    def cv(self) -> wp.CvDataset:
        return self._once("cv", lambda: wp.write_cv_dataset(self.base / "orig" / "cv"))

    def annotations(self) -> tuple[Path, dict]:
        def make():
            root = self.base / "orig" / "ann"
            return root, build_annotations(root)
        return self._once("ann", make)

    def objects(self) -> tuple[Path, dict]:
        def make():
            root = self.base / "orig" / "objs"
            return root, build_objects(root)
        return self._once("objs", make)

    def pair_copy(self, key: str, src: Path, dirs: dict[str, int]) -> Path:
        """A copy of SRC where every shard of each directory in DIRS (-> minishard_bits) is an
        obsolete .index + .data pair."""
        def make():
            dst = self.base / "pairs" / key
            shutil.copytree(src, dst)
            for d, bits in dirs.items():
                shards = sorted((dst / d).glob("*.shard"))
                assert shards, d
                for shard in shards:
                    split_shard(shard, bits)
            return dst
        return self._once(("pair", key), make)

    def mount(self, key: str, src: Path) -> Path:
        def make():
            m = self.base / "mnt" / key
            return self.stack.enter_context(zvfs_mount(src, m / "mnt", log=self.base / "mnt" / f"{key}.log"))
        (self.base / "mnt").mkdir(exist_ok=True)
        return self._once(("mount", key), make)

    def log(self, key: str) -> str:
        p = self.base / "mnt" / f"{key}.log"
        return p.read_text(errors="replace") if p.exists() else ""


@pytest.fixture(scope="session", autouse=True)
def cv_env(tmp_path_factory):
    """cloud-volume reads its cache/lock directories from the environment at import time: set
    them before any test of this module can import it, restore them at the end."""
    with wp.cloudvolume_env(tmp_path_factory.mktemp("cv-env")):
        yield


@pytest.fixture(scope="session")
def pc(tmp_path_factory, no_mounts_left_behind, cv_env):
    base = tmp_path_factory.mktemp("precomputed")
    with contextlib.ExitStack() as stack:
        yield Precomputed(base, stack)


def ts_mount(pc, name):
    return pc.mount(name, pc.ts(name))


# ----------------------------------------------------------------------------------------------
# 1. tensorstore volumes


@pytest.mark.parametrize("name", sorted(TS))
def test_ts_fixture_is_sharded_and_skips_zero_chunks(pc, name):
    """Sanity of the fixture itself: only shard files in the original, and the twin does not
    store the all-zero chunks (so 'absent chunk' below is a real case)."""
    ds = TS[name]
    orig, twin = pc.ts(name), pc.twin(name)
    for s in ds.scales:
        files = os.listdir(orig / s.key)
        assert files and all(f.endswith(".shard") == bool(s.sharding) for f in files), files
        names = set(os.listdir(twin / s.key))
        for cell in s.zero_cells:
            assert chunk_name(cell, s.size, s.voxel_offset, s.chunk_size) not in names
        grid = [math.ceil(a / b) for a, b in zip(s.size, s.chunk_size)]
        assert len(names) == math.prod(grid) - len(s.zero_cells)


@pytest.mark.parametrize("name", sorted(TS))
def test_ts_root_listing_and_info(pc, name):
    mnt = ts_mount(pc, name)
    orig = pc.ts(name)
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(orig))
    info = json.loads((mnt / "info").read_bytes())
    expected = drop_sharding(json.loads((orig / "info").read_text()))
    assert info == expected
    assert os.stat(mnt / "info").st_size == len((mnt / "info").read_bytes())
    # and it is tensorstore's own unsharded info for the scales
    twin = json.loads((pc.twin(name) / "info").read_text())
    assert info["scales"] == twin["scales"]


@pytest.mark.parametrize("case", TS_SCALES, ids=ts_scale_id)
def test_ts_scale_listing_equals_unsharded_twin(pc, case):
    name, i = case
    s = TS[name].scales[i]
    mnt = ts_mount(pc, name)
    assert sorted(os.listdir(mnt / s.key)) == sorted(os.listdir(pc.twin(name) / s.key))


@pytest.mark.parametrize("case", TS_SCALES, ids=ts_scale_id)
def test_ts_chunk_bytes_and_sizes_equal_unsharded_twin(pc, case):
    name, i = case
    s = TS[name].scales[i]
    mnt = ts_mount(pc, name)
    twin = pc.twin(name) / s.key
    bad = []
    for f in sorted(os.listdir(twin)):
        want = (twin / f).read_bytes()
        st = os.stat(mnt / s.key / f)
        got = (mnt / s.key / f).read_bytes()
        if got != want or st.st_size != len(want):
            bad.append((f, st.st_size, len(got), len(want)))
    assert not bad, f"{len(bad)} chunk files differ (name, st_size, read, expected): {bad[:5]}"


@pytest.mark.parametrize("case", TS_SCALES, ids=ts_scale_id)
def test_ts_absent_and_bogus_chunk_names_are_enoent(pc, case):
    name, i = case
    s = TS[name].scales[i]
    d = ts_mount(pc, name) / s.key
    names = [chunk_name(c, s.size, s.voxel_offset, s.chunk_size) for c in s.zero_cells]
    first = chunk_name((0, 0, 0), s.size, s.voxel_offset, s.chunk_size)
    lo = [s.voxel_offset[k] for k in range(3)]
    names += [
        f"{lo[0] + 1}-{lo[0] + 1 + s.chunk_size[0]}" + first[first.index("_"):],  # misaligned
        f"{lo[0]}-{lo[0] + min(s.chunk_size[0], s.size[0]) + 1}" + first[first.index("_"):],  # wrong end
        chunk_name((99, 0, 0), [10**6] * 3, s.voxel_offset, s.chunk_size),  # outside the grid
        first + ".gz", first.replace("_", "-"), "0", "-",
    ]
    for n in names:
        with pytest.raises(FileNotFoundError):
            os.stat(d / n)
        with pytest.raises(FileNotFoundError):
            open(d / n, "rb").close()


@pytest.mark.parametrize("case", TS_SCALES, ids=ts_scale_id)
def test_tensorstore_reads_mount_like_sharded_original(pc, case):
    name, i = case
    ds = TS[name]
    key = ds.scales[i].key
    want = wp.ts_open(pc.ts(name), key).read().result()
    np.testing.assert_array_equal(want, ds.data[i])  # the writer round-trips
    got = wp.ts_open(ts_mount(pc, name), key).read().result()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", TS_SCALES, ids=ts_scale_id)
def test_cloudvolume_reads_mount_like_sharded_original(pc, case):
    name, i = case
    ds = TS[name]
    want = np.asarray(wp.cv_open(pc.ts(name), mip=i)[:])
    np.testing.assert_array_equal(want, ds.data[i])
    vol = wp.cv_open(ts_mount(pc, name), mip=i)
    assert "sharding" not in vol.meta.info["scales"][i]
    got = np.asarray(vol[:])
    np.testing.assert_array_equal(got, want)


def test_ts_opening_chunks_by_name_without_listing(pc, tmp_path):
    """A fresh mount: stat + read chunks by name before any readdir of the scale directory."""
    name = "ts_image"
    twin = pc.twin(name)
    with zvfs_mount(pc.ts(name), tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        for s in TS[name].scales:
            wanted = sorted(os.listdir(twin / s.key))
            for f in (wanted[0], wanted[-1], wanted[len(wanted) // 2]):
                data = (twin / s.key / f).read_bytes()
                assert os.stat(mnt / s.key / f).st_size == len(data)
                with open(mnt / s.key / f, "rb") as fh:
                    assert fh.read() == data


def test_ts_partial_reads_at_odd_offsets(pc):
    """pread at arbitrary offsets and lengths (gzip-decoded and raw chunks), reads past EOF."""
    name = "ts_image"
    mnt, twin = ts_mount(pc, name), pc.twin(name)
    for s in TS[name].scales:
        for f in sorted(os.listdir(twin / s.key))[:3]:
            want = (twin / s.key / f).read_bytes()
            fd = os.open(mnt / s.key / f, os.O_RDONLY)
            try:
                for off, n in ((0, 1), (1, 7), (len(want) // 2, 333), (len(want) - 1, 10), (len(want), 5),
                               (len(want) + 100, 5), (3, len(want) * 2)):
                    assert os.pread(fd, n, off) == want[off:off + n], (f, off, n)
            finally:
                os.close(fd)


def test_ts_concurrent_reads(pc):
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    for name, ds in TS.items():
        mnt, twin = ts_mount(pc, name), pc.twin(name)
        for s in ds.scales:
            jobs += [(mnt / s.key / f, twin / s.key / f) for f in os.listdir(twin / s.key)]
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda j: j[0].read_bytes() == j[1].read_bytes(), jobs * 2))
    assert all(results)


def test_ts_passthrough_legacy_mesh_and_segment_properties(pc):
    mnt = ts_mount(pc, "ts_seg")
    for rel, data in pc.extras("ts_seg").items():
        assert (mnt / rel).read_bytes() == data, rel
        assert os.stat(mnt / rel).st_size == len(data)
    assert sorted(os.listdir(mnt / "legacy_mesh")) == sorted(os.listdir(pc.ts("ts_seg") / "legacy_mesh"))


# ----------------------------------------------------------------------------------------------
# 2. cloud-volume: sharded segmentation, skeletons, multiresolution meshes


def cv_mount(pc):
    return pc.mount("cv", pc.cv().root)


def test_cv_fixture_is_sharded_without_overwritten_shards(pc):
    ds = pc.cv()
    key = json.loads((ds.root / "info").read_text())["scales"][0]["key"]
    assert sorted(os.listdir(ds.root / key)) == ["0.shard", "1.shard"]  # one upload per shard
    for d in ("mesh", "skeletons"):
        files = set(os.listdir(ds.root / d)) - {"info"}
        assert files and all(f.endswith(".shard") for f in files), files
    # every skeleton made it (no upload replaced another's shard)
    orig = wp.cv_open(ds.root)
    for s, sk in ds.skeletons.items():
        np.testing.assert_allclose(orig.skeleton.get(s).vertices, sk.vertices)


def test_cv_infos_lose_sharding(pc):
    ds = pc.cv()
    mnt = cv_mount(pc)
    for rel in ("info", "mesh/info", "skeletons/info"):
        orig = json.loads((ds.root / rel).read_text())
        got = json.loads((mnt / rel).read_bytes())
        assert got == drop_sharding(orig), rel
        assert "sharding" in json.dumps(orig)  # the original really was sharded


def test_cv_volume_listing_and_bytes(pc):
    """Expected names computed from the grid; cloud-volume stores every chunk (zeros too) raw:
    the bytes are the label array cut per chunk in Fortran order."""
    ds = pc.cv()
    mnt = cv_mount(pc)
    key = json.loads((ds.root / "info").read_text())["scales"][0]["key"]
    grid = [math.ceil(a / b) for a, b in zip(wp.CV_SIZE, wp.CV_CHUNK)]
    expected = {}
    for cell in np.ndindex(*grid):
        sl = tuple(slice(g * c, min((g + 1) * c, s)) for g, c, s in zip(cell, wp.CV_CHUNK, wp.CV_SIZE))
        expected[chunk_name(cell, wp.CV_SIZE, (0, 0, 0), wp.CV_CHUNK)] = ds.labels[sl].tobytes(order="F")
    assert sorted(os.listdir(mnt / key)) == sorted(expected)
    for n, data in expected.items():
        assert (mnt / key / n).read_bytes() == data, n


def test_cv_volume_read_by_cloudvolume_and_tensorstore(pc):
    ds = pc.cv()
    mnt = cv_mount(pc)
    want = np.asarray(wp.cv_open(ds.root)[:])
    np.testing.assert_array_equal(want, ds.labels)
    np.testing.assert_array_equal(np.asarray(wp.cv_open(mnt)[:]), want)
    key = json.loads((ds.root / "info").read_text())["scales"][0]["key"]
    np.testing.assert_array_equal(wp.ts_open(ds.root, key).read().result(), ds.labels)
    np.testing.assert_array_equal(wp.ts_open(mnt, key).read().result(), ds.labels)


def test_cv_skeleton_files(pc):
    ds = pc.cv()
    mnt = cv_mount(pc)
    assert sorted(os.listdir(mnt / "skeletons")) == sorted([str(s) for s in ds.segids] + ["info"])
    for s, sk in ds.skeletons.items():
        data = sk.to_precomputed()
        assert (mnt / "skeletons" / str(s)).read_bytes() == data, s
        assert os.stat(mnt / "skeletons" / str(s)).st_size == len(data)
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "skeletons" / "4")


def test_cv_skeletons_read_by_cloudvolume(pc):
    ds = pc.cv()
    orig = wp.cv_open(ds.root)
    mounted = wp.cv_open(cv_mount(pc))
    for s in ds.segids:
        a, b = orig.skeleton.get(s), mounted.skeleton.get(s)
        np.testing.assert_array_equal(b.vertices, a.vertices)
        np.testing.assert_array_equal(b.edges, a.edges)
        np.testing.assert_array_equal(b.radii, a.radii)
        np.testing.assert_array_equal(b.vertex_types, a.vertex_types)
        np.testing.assert_allclose(a.vertices, ds.skeletons[s].vertices)  # identity transform


def test_cv_mesh_files(pc):
    ds = pc.cv()
    mnt = cv_mount(pc)
    want = sorted([f"{s}" for s in ds.segids] + [f"{s}.index" for s in ds.segids] + ["info"])
    assert sorted(os.listdir(mnt / "mesh")) == want
    for s, (frags, manifest) in ds.meshes.items():
        assert (mnt / "mesh" / f"{s}.index").read_bytes() == manifest, s
        assert (mnt / "mesh" / str(s)).read_bytes() == frags, s
        assert os.stat(mnt / "mesh" / str(s)).st_size == len(frags)


def test_cv_meshes_read_by_cloudvolume(pc):
    ds = pc.cv()
    orig = wp.cv_open(ds.root)
    mounted = wp.cv_open(cv_mount(pc))
    for s in ds.segids:
        for lod in (0, 1):
            a = orig.mesh.get(s, lod=lod)[s]
            b = mounted.mesh.get(s, lod=lod)[s]
            assert len(a.vertices) > 0
            np.testing.assert_array_equal(b.vertices, a.vertices)
            np.testing.assert_array_equal(b.faces, a.faces)


# ----------------------------------------------------------------------------------------------
# 3. cp -r of a mount is an unsharded dataset readers accept


@pytest.fixture(scope="session")
def copies(pc):
    out = {}
    for key, src in (("ts_image", lambda: ts_mount(pc, "ts_image")), ("ts_seg", lambda: ts_mount(pc, "ts_seg")),
                     ("cv", lambda: cv_mount(pc))):
        dst = pc.base / "copies" / key
        shutil.copytree(src(), dst)
        out[key] = dst
    return out


@pytest.mark.parametrize("key", ["ts_image", "ts_seg", "cv"])
def test_copy_has_no_shards(copies, key):
    for d, _, files in os.walk(copies[key]):
        assert not [f for f in files if f.endswith((".shard", ".index", ".data"))
                    and not (Path(d).name == "mesh" and f.endswith(".index"))], d


@pytest.mark.parametrize("case", TS_SCALES, ids=ts_scale_id)
def test_copy_read_by_tensorstore_and_cloudvolume(pc, copies, case):
    name, i = case
    ds = TS[name]
    key = ds.scales[i].key
    dst = copies[name]
    assert "sharding" not in json.loads((dst / "info").read_text())["scales"][i]
    np.testing.assert_array_equal(wp.ts_open(dst, key).read().result(), ds.data[i])
    np.testing.assert_array_equal(np.asarray(wp.cv_open(dst, mip=i)[:]), ds.data[i])
    # and the copy is tensorstore's own unsharded write, file for file
    twin = pc.twin(name) / key
    assert sorted(os.listdir(dst / key)) == sorted(os.listdir(twin))


def test_copy_of_cv_dataset_read_by_cloudvolume(pc, copies):
    ds = pc.cv()
    dst = copies["cv"]
    vol = wp.cv_open(dst)
    np.testing.assert_array_equal(np.asarray(vol[:]), ds.labels)
    orig = wp.cv_open(ds.root)
    for s in ds.segids:
        a, b = orig.skeleton.get(s), vol.skeleton.get(s)
        np.testing.assert_array_equal(b.vertices, a.vertices)
        np.testing.assert_array_equal(b.edges, a.edges)
        np.testing.assert_array_equal(b.radii, a.radii)
        ma, mb = orig.mesh.get(s)[s], vol.mesh.get(s)[s]
        np.testing.assert_array_equal(mb.vertices, ma.vertices)
        np.testing.assert_array_equal(mb.faces, ma.faces)


# ----------------------------------------------------------------------------------------------
# 4. annotations (own encoder), and the obsolete .index + .data pair


@pytest.mark.parametrize("spec,kw", [(ANN_BY_ID, {}), (ANN_REL, {"layout": "index_first", "reverse_data": True}),
                                     (ANN_SPATIAL, {"layout": "index_first"})])
def test_annotation_encoder_is_read_by_tensorstore(tmp_path, spec, kw):
    """The test's own shard encoder, checked by an independent reader (tensorstore's
    neuroglancer_uint64_sharded kvstore) so that zvfs is not judged against a shared mistake."""
    import tensorstore as ts

    rng = np.random.default_rng(1)
    items = {int(i): rng.bytes(int(rng.integers(1, 50))) for i in rng.choice(2**62, 60, replace=False)}
    items[2**64 - 7] = b"last"
    for name, data in encode_shards(spec, items, **kw).items():
        (tmp_path / name).write_bytes(data)
    kv = ts.KvStore.open({"driver": "neuroglancer_uint64_sharded", "base": f"file://{tmp_path}/",
                          "metadata": spec}).result()
    for k, v in items.items():
        assert kv.read(struct.pack(">Q", k)).result().value == v, k
    assert sorted(struct.unpack(">Q", k)[0] for k in kv.list().result()) == sorted(items)


def ann_mount(pc):
    root, _ = pc.annotations()
    return pc.mount("ann", root)


def test_annotation_info_loses_sharding(pc):
    root, exp = pc.annotations()
    mnt = ann_mount(pc)
    got = json.loads((mnt / "info").read_bytes())
    assert got == drop_sharding(exp["info"])
    assert "sharding" not in json.dumps(got)


@pytest.mark.parametrize("d", ["by_id", "rel_segments", "spatial1", "spatial0"])
def test_annotation_names_and_bytes(pc, d):
    root, exp = pc.annotations()
    mnt = ann_mount(pc)
    want = {k.split("/", 1)[1]: v for k, v in exp["files"].items() if k.startswith(d + "/")}
    assert sorted(os.listdir(mnt / d)) == sorted(want)
    for n, data in want.items():
        assert (mnt / d / n).read_bytes() == data, f"{d}/{n}"
        assert os.stat(mnt / d / n).st_size == len(data)


def test_annotation_lookup_by_name_and_absent_ids(pc, tmp_path):
    root, exp = pc.annotations()
    with zvfs_mount(root, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        for k, v in list(exp["files"].items())[:12]:  # no listing first
            assert (mnt / k).read_bytes() == v, k
        for bad in ("by_id/4", "by_id/18446744073709551616", "by_id/-1", "spatial1/5_0_0", "spatial1/0_0",
                    "spatial1/9_9_9", "rel_segments/10"):
            with pytest.raises(FileNotFoundError):
                os.stat(mnt / bad)


def test_obsolete_index_data_pair_in_annotations(pc):
    root, exp = pc.annotations()
    assert list((root / "by_id").glob("*.index")) and list((root / "by_id").glob("*.data"))
    mnt = ann_mount(pc)
    stem = sorted((root / "by_id").glob("*.index"))[0].stem
    in_pair = [k for k in exp["files"] if k.startswith("by_id/")
               and shard_location(ANN_BY_ID, int(k.split("/")[1]))[0] == stem]
    assert in_pair
    for k in in_pair:
        assert (mnt / k).read_bytes() == exp["files"][k]


@pytest.fixture(scope="session")
def pair_dataset(pc):
    """A copy of ts_image where every shard of the first scale and one of the second are
    obsolete .index + .data pairs."""
    dst = pc.base / "pair" / "ts_image"
    shutil.copytree(pc.ts("ts_image"), dst)
    s0, s1, _ = TS["ts_image"].scales
    for shard in sorted((dst / s0.key).glob("*.shard")):
        split_shard(shard, s0.sharding["minishard_bits"])
    split_shard(sorted((dst / s1.key).glob("*.shard"))[1], s1.sharding["minishard_bits"])
    return dst


@pytest.mark.parametrize("i", [0, 1, 2])
def test_obsolete_pair_volume_reads_like_the_shard(pc, pair_dataset, i):
    s = TS["ts_image"].scales[i]
    mnt = pc.mount("pair", pair_dataset)
    twin = pc.twin("ts_image") / s.key
    assert sorted(os.listdir(mnt / s.key)) == sorted(os.listdir(twin))
    for f in os.listdir(twin):
        assert (mnt / s.key / f).read_bytes() == (twin / f).read_bytes(), f
    np.testing.assert_array_equal(wp.ts_open(mnt, s.key).read().result(), TS["ts_image"].data[i])


def _check_object_files(mnt: Path, expected: dict, dirs) -> None:
    for d in dirs:
        want = {k.split("/", 1)[1]: v for k, v in expected.items() if k.startswith(d + "/")}
        listed = set(os.listdir(mnt / d))
        assert listed == set(want), f"{d}: missing {sorted(set(want) - listed)}, extra {sorted(listed - set(want))}"
        bad = [n for n, v in want.items() if (mnt / d / n).read_bytes() != v or os.stat(mnt / d / n).st_size != len(v)]
        assert not bad, f"{d}: wrong bytes or size for {bad}"


def test_gzip_manifest_meshes_and_raw_skeletons(pc):
    """Mesh data_encoding gzip applies to the manifest only: `<id>.index` is the decoded
    manifest, `<id>` the raw fragment data stored right before it (here in an unusual layout)."""
    root, exp = pc.objects()
    mnt = pc.mount("objs", root)
    assert json.loads((mnt / "info").read_bytes()) == exp["info"]
    _check_object_files(mnt, exp, ["mesh_gz", "skel_raw"])
    assert (mnt / "s" / "0-8_0-8_0-8").read_bytes() == exp["s/0-8_0-8_0-8"]  # unsharded scale: as stored


def test_gzip_manifest_meshes_read_by_cloudvolume(pc):
    root, exp = pc.objects()
    orig, mounted = wp.cv_open(root), wp.cv_open(pc.mount("objs", root))
    for s in OBJ_IDS:
        a, b = orig.skeleton.get(s), mounted.skeleton.get(s)
        np.testing.assert_array_equal(b.vertices, a.vertices)
        np.testing.assert_array_equal(b.edges, a.edges)
        if s == OBJ_EMPTY_MESH:
            continue  # cloud-volume returns nothing for a mesh without fragments
        for lod in (0, 1):
            ma, mb = orig.mesh.get(s, lod=lod)[s], mounted.mesh.get(s, lod=lod)[s]
            assert len(ma.vertices)
            np.testing.assert_array_equal(mb.vertices, ma.vertices)
            np.testing.assert_array_equal(mb.faces, ma.faces)


def test_obsolete_pair_for_meshes_and_skeletons(pc):
    """Every mesh and skeleton shard as an .index + .data pair reads like the .shard."""
    root, exp = pc.objects()
    src = pc.pair_copy("objs", root, {"mesh_gz": OBJ_MESH["minishard_bits"], "skel_raw": OBJ_SKEL["minishard_bits"]})
    _check_object_files(pc.mount("objs_pair", src), exp, ["mesh_gz", "skel_raw"])


def test_obsolete_pair_for_cloudvolume_meshes_and_skeletons(pc):
    """The igneous layout as pairs: the first segment's fragments start at byte 0 of X.data."""
    ds = pc.cv()
    src = pc.pair_copy("cv", ds.root, {"mesh": wp.CV_MESH_SHARDING["minishard_bits"],
                                       "skeletons": wp.CV_SKEL_SHARDING["minishard_bits"],
                                       "8_8_40": wp.CV_VOLUME_SHARDING["minishard_bits"]})
    mnt = pc.mount("cv_pair", src)
    exp = {f"mesh/{s}.index": m for s, (_, m) in ds.meshes.items()}
    exp.update({f"mesh/{s}": f for s, (f, _) in ds.meshes.items()})
    exp.update({f"skeletons/{s}": sk.to_precomputed() for s, sk in ds.skeletons.items()})
    exp["mesh/info"] = json.dumps(drop_sharding(json.loads((ds.root / "mesh" / "info").read_text()))).encode()
    exp["skeletons/info"] = json.dumps(drop_sharding(json.loads((ds.root / "skeletons" / "info").read_text()))).encode()
    for k in ("mesh/info", "skeletons/info"):  # compare infos as JSON, not as text
        assert json.loads((mnt / k).read_bytes()) == json.loads(exp[k])
        exp[k] = (mnt / k).read_bytes()
    _check_object_files(mnt, exp, ["mesh", "skeletons"])
    np.testing.assert_array_equal(np.asarray(wp.cv_open(mnt)[:]), ds.labels)


# ----------------------------------------------------------------------------------------------
# 5. corrupt minishard indexes at read time


def _minishards(s: wp.TsScale, name_of_cell) -> dict[tuple[str, int], list[str]]:
    """(shard stem, minishard) -> chunk names, computed from the grid, Morton code and hash."""
    grid = [math.ceil(a / b) for a, b in zip(s.size, s.chunk_size)]
    out: dict = {}
    for cell in np.ndindex(*grid):
        if cell in s.zero_cells:
            continue
        out.setdefault(shard_location(s.sharding, morton(cell, grid)), []).append(name_of_cell(cell))
    return out


@pytest.fixture(scope="session")
def corrupt(pc):
    """A copy of ts_image with damaged shards; returns (root, {scale key: set of bad names})."""
    dst = pc.base / "corrupt" / "ts_image"
    shutil.copytree(pc.ts("ts_image"), dst)
    rng = np.random.default_rng(3)
    bad: dict[str, set] = {}
    s0, s1, s2 = TS["ts_image"].scales

    def groups(s):
        return _minishards(s, lambda c: chunk_name(c, s.size, s.voxel_offset, s.chunk_size))

    def index_of(path, s):
        k = 16 << s.sharding["minishard_bits"]
        return np.frombuffer(path.read_bytes()[:k], dtype="<u8").reshape(-1, 2).copy(), k

    # s0 (gzip minishard indexes): garbage over one minishard index of shard 0, and a truncated
    # gzip stream (shard index end moved back) for one minishard of shard 1
    g0 = groups(s0)
    done = set()
    for (stem, mini), names in sorted(g0.items()):
        if stem in done:
            continue
        path = dst / s0.key / f"{stem}.shard"
        index, k = index_of(path, s0)
        start, end = (int(v) for v in index[mini])
        raw = bytearray(path.read_bytes())
        if stem == "0":
            raw[k + start:k + end] = rng.integers(0, 256, end - start, dtype=np.uint8).tobytes()
        else:
            index[mini, 1] = end - 7
            raw[:k] = index.astype("<u8").tobytes()
        path.write_bytes(bytes(raw))
        bad.setdefault(s0.key, set()).update(names)
        done.add(stem)
    assert done == {"0", "1"}
    # s1 (raw minishard indexes): one index no longer a multiple of 24 bytes
    g1 = groups(s1)
    (stem, mini), names = sorted(g1.items())[0]
    path = dst / s1.key / f"{stem}.shard"
    index, k = index_of(path, s1)
    index[mini, 1] -= 5
    raw = bytearray(path.read_bytes())
    raw[:k] = index.astype("<u8").tobytes()
    path.write_bytes(bytes(raw))
    bad[s1.key] = set(names)
    # s2: the only shard cut short inside its shard index
    path = dst / s2.key / "0.shard"
    path.write_bytes(path.read_bytes()[:9])
    bad[s2.key] = {n for names in groups(s2).values() for n in names}
    return dst, bad


def minishard_entries(raw: bytes, spec: dict, mini: int) -> list[tuple[int, int, int]]:
    """(chunk id, absolute start, size) of one minishard of a shard file, decoded per the spec."""
    k = 16 << spec["minishard_bits"]
    start, end = struct.unpack_from("<QQ", raw, 16 * mini)
    blob = raw[k + start:k + end]
    if spec["minishard_index_encoding"] == "gzip":
        blob = gzip.decompress(blob)
    t = np.frombuffer(blob, dtype="<u8").reshape(3, -1)
    out, cid, pos = [], 0, k
    for d_id, d_off, size in zip(*(t[r].tolist() for r in range(3))):
        cid = (cid + d_id) % 2**64
        pos = (pos + d_off) % 2**64
        out.append((cid, pos, size))
        pos += size
    return out


@pytest.fixture(scope="session")
def corrupt_data(pc):
    """A copy of ts_seg where the gzip data of one chunk of the gzip-encoded scale is garbage.
    Returns (root, scale, bad chunk name)."""
    s = TS["ts_seg"].scales[1]
    assert s.sharding["data_encoding"] == "gzip"
    dst = pc.base / "corrupt-data" / "ts_seg"
    shutil.copytree(pc.ts("ts_seg"), dst)
    grid = [math.ceil(a / b) for a, b in zip(s.size, s.chunk_size)]
    cell = (1, 0, 1)
    assert cell not in s.zero_cells
    stem, mini = shard_location(s.sharding, morton(cell, grid))
    path = dst / s.key / f"{stem}.shard"
    raw = bytearray(path.read_bytes())
    (start, size), = [(st, n) for cid, st, n in minishard_entries(bytes(raw), s.sharding, mini)
                      if cid == morton(cell, grid)]
    raw[start + 10:start + size - 8] = b"\xff" * (size - 18)  # header intact, deflate stream garbage
    path.write_bytes(bytes(raw))
    return dst, s, chunk_name(cell, s.size, s.voxel_offset, s.chunk_size)


def test_corrupt_chunk_data_gives_eio_and_the_directory_still_lists(pc, corrupt_data):
    root, s, bad = corrupt_data
    mnt = pc.mount("corrupt_data", root)
    twin = pc.twin("ts_seg") / s.key
    assert read_eio(mnt / s.key / bad)
    try:
        listing = set(os.listdir(mnt / s.key))
    except OSError as e:
        pytest.fail(f"one chunk with bad gzip data makes the whole directory unlistable: {e!r}")
    assert listing - {bad} == set(os.listdir(twin)) - {bad}
    for n in sorted(set(os.listdir(twin)) - {bad}):
        assert (mnt / s.key / n).read_bytes() == (twin / n).read_bytes(), n
    assert is_mounted(mnt)


@pytest.mark.parametrize("i", [0, 1, 2])
def test_corrupt_minishard_gives_eio_others_read(pc, corrupt, i):
    root, bad = corrupt
    s = TS["ts_image"].scales[i]
    mnt = pc.mount("corrupt", root)
    twin = pc.twin("ts_image") / s.key
    good = set(os.listdir(twin)) - bad[s.key]
    assert bad[s.key] and (good or i == 2)
    # by name first (no listing yet for this directory): EIO, never data and never ENOENT
    not_eio = [n for n in sorted(bad[s.key]) if not read_eio(mnt / s.key / n)]
    assert not not_eio, f"chunks of a corrupt minishard read without error: {not_eio[:5]}"
    listing = set(os.listdir(mnt / s.key))
    assert good <= listing
    assert listing <= set(os.listdir(twin))
    for n in listing & bad[s.key]:  # if a bad chunk is listed at all, it must still be EIO
        assert read_eio(mnt / s.key / n), n
    for n in sorted(good):
        assert (mnt / s.key / n).read_bytes() == (twin / n).read_bytes(), n
    # tensorstore must not read zeros in place of the damaged chunks
    with pytest.raises(Exception):
        wp.ts_open(mnt, s.key).read().result()
    # the mount is still up and serving
    assert is_mounted(mnt)
    assert "info" in os.listdir(mnt)
    assert json.loads((mnt / "info").read_bytes())["scales"][i]["key"] == s.key


# ----------------------------------------------------------------------------------------------
# the same tree without mounting


def test_zvfs_ls_and_cat_match_the_twin(pc):
    name = "ts_image"
    src, twin = pc.ts(name), pc.twin(name)
    for s in TS[name].scales:
        r = run_zvfs("ls", src, s.key)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.decode().split()) == sorted(os.listdir(twin / s.key))
        f = sorted(os.listdir(twin / s.key))[-1]
        r = run_zvfs("cat", src, f"{s.key}/{f}")
        assert r.returncode == 0, r.stderr
        assert r.stdout == (twin / s.key / f).read_bytes()
    r = run_zvfs("cat", src, "info")
    assert json.loads(r.stdout) == drop_sharding(json.loads((src / "info").read_text()))
    r = run_zvfs("cat", src, f"{TS[name].scales[0].key}/0-8_0-8_0-4")
    assert r.returncode != 0


def test_zvfs_ls_cat_cloudvolume_objects(pc):
    ds = pc.cv()
    r = run_zvfs("ls", ds.root, "mesh")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().split()) == sorted([str(s) for s in ds.segids] + [f"{s}.index" for s in ds.segids] + ["info"])
    s = ds.segids[-1]
    r = run_zvfs("cat", ds.root, f"mesh/{s}")
    assert r.stdout == ds.meshes[s][0]
    r = run_zvfs("cat", ds.root, f"skeletons/{s}")
    assert r.stdout == ds.skeletons[s].to_precomputed()


def test_zvfs_inspect_precomputed(pc):
    """Shard and chunk counts per scale agree with the files of the original and of the twin."""
    name = "ts_image"
    src, twin = pc.ts(name), pc.twin(name)
    r = run_zvfs("inspect", src)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert all(s.key in r.stdout.decode() for s in TS[name].scales)
    r = run_zvfs("inspect", "--json", src)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    described = json.loads(r.stdout)
    dirs = {d["path"]: d for d in described["precomputed"]["sharded_dirs"]}
    for s in TS[name].scales:
        d = dirs[s.key]
        assert d["shards_present"] == len(os.listdir(src / s.key))
        assert d["chunks"] == len(os.listdir(twin / s.key))


def test_logs_of_intact_mounts_have_no_errors(pc):
    """Runs last: mounts of intact datasets logged no warnings, errors or tracebacks."""
    for key in ("ts_image", "ts_seg", "cv", "ann", "objs", "pair"):
        log = pc.log(key)
        bad = [l for l in log.splitlines() if " WARNING " in l or " ERROR " in l or "Traceback" in l]
        assert not bad, f"{key}: {bad[:3]}"
