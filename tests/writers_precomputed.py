"""Writers of sharded Neuroglancer-precomputed fixtures, each by an independent program.

- `write_ts_dataset`: tensorstore (`neuroglancer_precomputed` driver) writes a multiscale volume
  with per-scale `sharding`; with ``unsharded=True`` the same data and scale metadata minus
  `sharding` (the twin whose file names and bytes a zvfs mount must show).
- `write_cv_dataset`: cloud-volume writes a sharded segmentation volume, sharded skeletons and
  sharded multiresolution meshes the way igneous does (`synthesize_shard_files` over the
  per-object bytes; for meshes the fragment data right before the manifest).

Nothing here reads anything through zvfs. Expected chunk names and bytes come from the writers
themselves (the unsharded twin) or from the data put in.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SHARDED = "neuroglancer_uint64_sharded_v1"


def sharding(hash="identity", preshift=0, minishard=1, shard=1, index="gzip", data="gzip") -> dict:
    return {"@type": SHARDED, "hash": hash, "preshift_bits": preshift, "minishard_bits": minishard,
            "shard_bits": shard, "minishard_index_encoding": index, "data_encoding": data}


# ----------------------------------------------------------------------------------------------
# cloud-volume needs its cache / lock directories away from $HOME

CV_ENV = ("CLOUD_FILES_DIR", "CLOUD_FILES_LOCK_DIR", "CLOUD_VOLUME_DIR")


@contextlib.contextmanager
def cloudvolume_env(base: Path):
    saved = {k: os.environ.get(k) for k in CV_ENV}
    try:
        for k in CV_ENV:
            d = Path(base) / k.lower()
            d.mkdir(parents=True, exist_ok=True)
            os.environ[k] = str(d)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ----------------------------------------------------------------------------------------------
# tensorstore volumes


@dataclass
class TsScale:
    key: str
    size: tuple[int, int, int]
    voxel_offset: tuple[int, int, int]
    chunk_size: tuple[int, int, int]
    resolution: tuple[float, float, float]
    sharding: dict | None  # None: an unsharded scale
    encoding: str = "raw"
    block_size: tuple[int, int, int] | None = None  # compressed_segmentation_block_size
    zero_cells: tuple = ()  # grid cells forced to all-zero (tensorstore does not store them)


@dataclass
class TsDataset:
    name: str
    type: str  # image | segmentation
    dtype: str
    scales: list[TsScale]
    num_channels: int = 1
    data: list[np.ndarray] = field(default_factory=list)  # per scale, (x, y, z, c)


def ts_datasets() -> list[TsDataset]:
    """The two tensorstore datasets: every combination the brief asks for appears somewhere."""
    image = TsDataset("ts_image", "image", "uint8", [
        # identity hash, preshift > 0, gzip/gzip, negative voxel_offset, truncated edges, a hole
        TsScale("4_4_40", (37, 29, 11), (-50, -5, 0), (8, 8, 4), (4, 4, 40),
                sharding("identity", preshift=1, minishard=2, shard=1, index="gzip", data="gzip"),
                zero_cells=((0, 0, 0), (4, 3, 2))),
        # murmurhash, raw/raw, several shards
        TsScale("8_8_40", (19, 15, 11), (-25, -3, 0), (8, 8, 4), (8, 8, 40),
                sharding("murmurhash3_x86_128", preshift=0, minishard=1, shard=2, index="raw", data="raw"),
                zero_cells=((1, 1, 1),)),
        # one shard, one minishard: raw index, gzip data
        TsScale("16_16_40", (10, 8, 6), (-13, -2, 0), (4, 4, 4), (16, 16, 40),
                sharding("identity", preshift=0, minishard=0, shard=0, index="raw", data="gzip")),
    ])
    seg = TsDataset("ts_seg", "segmentation", "uint32", [
        # compressed_segmentation, murmurhash with preshift, gzip index, raw data
        TsScale("6_6_30", (33, 20, 9), (7, -3, -2), (8, 8, 4), (6, 6, 30),
                sharding("murmurhash3_x86_128", preshift=2, minishard=3, shard=1, index="gzip", data="raw"),
                encoding="compressed_segmentation", block_size=(4, 4, 2), zero_cells=((2, 1, 1),)),
        # raw encoding, identity, raw index, gzip data
        TsScale("12_12_30", (17, 10, 5), (3, -2, -1), (8, 8, 4), (12, 12, 30),
                sharding("identity", preshift=0, minishard=1, shard=1, index="raw", data="gzip"),
                zero_cells=((0, 1, 0),)),
        # an unsharded scale in a sharded dataset: shown as stored
        TsScale("24_24_30", (9, 5, 3), (1, -1, -1), (4, 4, 2), (24, 24, 30), None, zero_cells=((1, 0, 0),)),
    ])
    rng = np.random.default_rng(1234)
    for ds in (image, seg):
        for s in ds.scales:
            shape = (*s.size, ds.num_channels)
            if ds.type == "image":
                a = rng.integers(1, 256, shape, dtype=np.uint8)
            else:  # blocky labels (some large ids) so compressed_segmentation has several values
                small = rng.integers(1, 6, tuple(-(-n // 3) for n in s.size) + (1,), dtype=np.uint32)
                a = np.repeat(np.repeat(np.repeat(small, 3, 0), 3, 1), 3, 2)[: s.size[0], : s.size[1], : s.size[2]]
                a = np.ascontiguousarray(a * np.uint32(1000003))
            for cell in s.zero_cells:
                sl = tuple(slice(c * k, (c + 1) * k) for c, k in zip(cell, s.chunk_size))
                a[sl] = 0
            ds.data.append(a)
    return [image, seg]


def ts_spec(root: Path, ds: TsDataset, scale: TsScale, unsharded: bool, create: bool) -> dict:
    sm = {"key": scale.key, "size": list(scale.size), "voxel_offset": list(scale.voxel_offset),
          "chunk_size": list(scale.chunk_size), "resolution": list(scale.resolution),
          "encoding": scale.encoding}
    if scale.block_size:
        sm["compressed_segmentation_block_size"] = list(scale.block_size)
    if not unsharded and scale.sharding:
        sm["sharding"] = scale.sharding
    spec = {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(root) + "/"},
            "scale_metadata": sm}
    if create:
        spec["multiscale_metadata"] = {"type": ds.type, "data_type": ds.dtype, "num_channels": ds.num_channels}
        spec["create"] = True
    return spec


def write_ts_dataset(root: Path, ds: TsDataset, unsharded: bool = False) -> Path:
    import tensorstore as ts

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for scale, data in zip(ds.scales, ds.data):
        t = ts.open(ts_spec(root, ds, scale, unsharded, create=True)).result()
        t[...] = data  # the whole scale in one write: every shard complete
    return root


def ts_open(root: Path, scale_key: str):
    """Open one scale of an existing dataset read-only (whatever its info says)."""
    import tensorstore as ts

    spec = {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(root) + "/"},
            "scale_metadata": {"key": scale_key}, "open": True,
            "context": {"cache_pool": {"total_bytes_limit": 0}}}
    return ts.open(spec, read=True).result()


def add_passthrough_extras(root: Path) -> dict[str, bytes]:
    """A legacy mesh directory and segment_properties: never sharded, shown as stored.

    Returns {relative path: bytes} of what was written (the expected pass-through files)."""
    info_path = Path(root) / "info"
    info = json.loads(info_path.read_text())
    info["mesh"] = "legacy_mesh"
    info["segment_properties"] = "segprops"
    info_path.write_text(json.dumps(info))
    files = {
        "legacy_mesh/info": json.dumps({"@type": "neuroglancer_legacy_mesh"}).encode(),
        "legacy_mesh/1000003:0": json.dumps({"fragments": ["1000003:0:0-8_0-8_0-4"]}).encode(),
        "legacy_mesh/1000003:0:0-8_0-8_0-4": struct.pack("<I", 3) + np.arange(9, dtype="<f4").tobytes()
        + np.array([0, 1, 2], dtype="<u4").tobytes(),
        "segprops/info": json.dumps({"@type": "neuroglancer_segment_properties", "inline": {
            "ids": ["1000003", "2000006"],
            "properties": [{"id": "label", "type": "label", "values": ["a", "b"]}]}}).encode(),
    }
    for rel, data in files.items():
        p = Path(root) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


# ----------------------------------------------------------------------------------------------
# cloud-volume: sharded segmentation, skeletons and multiresolution meshes (igneous style)

CV_SIZE = (64, 64, 16)
CV_CHUNK = (16, 16, 8)
# grid (4, 4, 2): Morton bits x0 y0 z0 x1 y1; preshift 2 + minishard 2 -> shard = bit 4 = y1, so
# the shard of a chunk depends on y only: y in [0, 32) is shard 0, [32, 64) shard 1. Uploading
# those two regions one by one writes each shard exactly once (no overwrite).
CV_VOLUME_SHARDING = sharding("identity", preshift=2, minishard=2, shard=1, index="gzip", data="gzip")
CV_SHARD_REGIONS = [(slice(0, 64), slice(0, 32), slice(0, 16)), (slice(0, 64), slice(32, 64), slice(0, 16))]
# igneous defaults for objects: murmurhash, preshift 0, gzip minishard indexes; skeleton data gzip,
# mesh data raw. shard_bits <= 3 keeps synthesize_shard_files' decimal file names equal to hex.
CV_SKEL_SHARDING = sharding("murmurhash3_x86_128", preshift=0, minishard=2, shard=2, index="gzip", data="gzip")
CV_MESH_SHARDING = sharding("murmurhash3_x86_128", preshift=0, minishard=1, shard=2, index="gzip", data="raw")
CV_SEGIDS = [1, 2, 3, 7, 12, 99, 1000, 2**40 + 5, 2**63 + 11]
VERTEX_QUANTIZATION_BITS = 16


@dataclass
class CvDataset:
    root: Path
    labels: np.ndarray
    segids: list[int]
    skeletons: dict  # segid -> osteoid Skeleton (as uploaded)
    meshes: dict  # segid -> (fragments bytes, manifest bytes)


def cv_labels() -> np.ndarray:
    rng = np.random.default_rng(77)
    small = rng.choice(np.array(CV_SEGIDS, dtype=np.uint64), size=(8, 8, 2))
    a = np.repeat(np.repeat(np.repeat(small, 8, 0), 8, 1), 8, 2)
    a[0:16, 0:16, 0:8] = 0  # an all-zero chunk (cloud-volume stores it anyway)
    return np.ascontiguousarray(a[..., None])


def make_skeleton(segid: int, rng):
    from cloudvolume import Skeleton

    n = int(rng.integers(3, 12))
    vertices = rng.uniform(0, 500, (n, 3)).astype(np.float32)
    edges = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1).astype(np.uint32)
    radii = rng.uniform(1, 9, n).astype(np.float32)
    vtypes = rng.integers(0, 5, n).astype(np.uint8)
    return Skeleton(vertices, edges, radii=radii, vertex_types=vtypes, segid=segid)


def make_multires_mesh(segid: int, rng, empty: bool = False) -> tuple[bytes, bytes]:
    """Draco fragments for two levels of detail and the manifest describing them (igneous layout:
    fragments of lod 0, then lod 1, each in Morton order). Includes one empty fragment; with
    ``empty`` every fragment is empty (no fragment data at all)."""
    import DracoPy
    from cloudvolume.datasource.precomputed.mesh.multilod import MultiLevelPrecomputedMeshManifest

    top = (1 << VERTEX_QUANTIZATION_BITS) - 1

    def fragment():
        n = int(rng.integers(4, 10))
        verts = rng.integers(0, top, (n, 3)).astype(np.float32)
        faces = np.array([[i, (i + 1) % n, (i + 2) % n] for i in range(n)], dtype=np.uint32)
        return DracoPy.encode(verts, faces, quantization_bits=VERTEX_QUANTIZATION_BITS,
                              quantization_range=top, quantization_origin=(0, 0, 0))

    lod0 = [b"", b"", b""] if empty else [fragment(), b"", fragment()]
    lod1 = [b""] if empty else [fragment()]
    positions = [np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.uint32), np.array([[0, 0, 0]], dtype=np.uint32)]
    manifest = MultiLevelPrecomputedMeshManifest(
        segid, chunk_shape=np.array([32, 32, 16], dtype=np.float32), grid_origin=np.array([0, 0, 0], dtype=np.float32),
        num_lods=2, lod_scales=np.array([1, 2], dtype=np.float32),
        vertex_offsets=np.zeros((2, 3), dtype=np.float32), num_fragments_per_lod=np.array([3, 1], dtype=np.uint32),
        fragment_positions=positions,
        fragment_offsets=np.array([len(f) for f in lod0 + lod1], dtype=np.uint32))
    return b"".join(lod0 + lod1), manifest.to_binary()


def write_cv_dataset(root: Path) -> CvDataset:
    """Sharded segmentation + skeletons + multiresolution meshes written by cloud-volume."""
    from cloudfiles import CloudFiles
    from cloudvolume import CloudVolume
    from cloudvolume.datasource.precomputed.sharding import ShardingSpecification, synthesize_shard_files

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    url = "file://" + str(root)
    info = CloudVolume.create_new_info(
        num_channels=1, layer_type="segmentation", data_type="uint64", encoding="raw",
        resolution=[8, 8, 40], voxel_offset=[0, 0, 0], chunk_size=list(CV_CHUNK), volume_size=list(CV_SIZE),
        mesh="mesh", skeletons="skeletons")
    info["scales"][0]["sharding"] = CV_VOLUME_SHARDING
    vol = CloudVolume(url, info=info, progress=False, compress=False)
    vol.commit_info()
    labels = cv_labels()
    for region in CV_SHARD_REGIONS:  # one shard per upload, as igneous' image shard tasks do
        vol[region] = labels[region]

    # skeletons: the sharded skeleton source uploads one complete shard per call
    skel_info = {
        "@type": "neuroglancer_skeletons", "transform": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
        "vertex_attributes": [{"id": "radius", "data_type": "float32", "num_components": 1},
                              {"id": "vertex_types", "data_type": "uint8", "num_components": 1}],
        "sharding": CV_SKEL_SHARDING, "spatial_index": None}
    CloudFiles(url).put_json("skeletons/info", skel_info)
    rng = np.random.default_rng(5)
    skeletons = {s: make_skeleton(s, rng) for s in CV_SEGIDS}
    vol = CloudVolume(url, progress=False)
    spec = ShardingSpecification.from_dict(CV_SKEL_SHARDING)
    by_shard: dict[int, list] = {}
    for s, sk in skeletons.items():
        by_shard.setdefault(spec.compute_shard_location(s).shard_number, []).append(sk)
    for group in by_shard.values():
        vol.skeleton.upload(group)

    # multiresolution meshes: per segment fragments + manifest, manifest is the chunk
    mesh_info = {"@type": "neuroglancer_multilod_draco", "vertex_quantization_bits": VERTEX_QUANTIZATION_BITS,
                 "transform": [8, 0, 0, 0, 0, 8, 0, 0, 0, 0, 40, 0], "lod_scale_multiplier": 1.0,
                 "sharding": CV_MESH_SHARDING}
    CloudFiles(url).put_json("mesh/info", mesh_info)
    meshes = {s: make_multires_mesh(s, rng) for s in CV_SEGIDS}
    mspec = ShardingSpecification.from_dict(CV_MESH_SHARDING)
    shard_files = synthesize_shard_files(
        mspec, {s: frag + man for s, (frag, man) in meshes.items()}, {s: len(man) for s, (_, man) in meshes.items()})
    CloudFiles(url + "/mesh").puts(shard_files.items(), compress=False, content_type="application/octet-stream")
    return CvDataset(root, labels, list(CV_SEGIDS), skeletons, meshes)


def cv_open(path: Path, **kw):
    from cloudvolume import CloudVolume

    return CloudVolume("file://" + str(path), progress=False, fill_missing=True, cache=False, **kw)


# ----------------------------------------------------------------------------------------------
# tensorstore volumes for the array views (--view zarr / zarr2 / n5)


def array_datasets() -> list[TsDataset]:
    """Volumes for the array views, every combination issue 14 names: raw,
    compressed_segmentation, jpeg and png; uint8, uint32, uint64 (and a 2-channel uint16);
    unsharded, sharded
    with identity and murmurhash3 hashes, gzip and raw minishard-index and data encodings;
    several scales; sizes that are not multiples of the chunk size; chunks never written."""
    u8 = TsDataset("pa_u8", "image", "uint8", [
        TsScale("4_4_40", (37, 29, 11), (-50, -5, 0), (8, 8, 4), (4, 4, 40), None, zero_cells=((0, 0, 0), (4, 3, 2))),
        TsScale("8_8_40", (19, 15, 11), (-25, -3, 0), (8, 8, 4), (8, 8, 40),
                sharding("identity", preshift=1, minishard=2, shard=1, index="gzip", data="raw"), zero_cells=((1, 1, 1),)),
        TsScale("16_16_40", (10, 8, 6), (-13, -2, 0), (4, 4, 4), (16, 16, 40),
                sharding("murmurhash3_x86_128", preshift=0, minishard=1, shard=2, index="raw", data="gzip"),
                zero_cells=((0, 1, 0),)),
    ])
    u32 = TsDataset("pa_u32", "segmentation", "uint32", [
        TsScale("6_6_30", (33, 20, 9), (7, -3, -2), (8, 8, 4), (6, 6, 30),
                sharding("murmurhash3_x86_128", preshift=2, minishard=3, shard=1, index="gzip", data="raw"),
                encoding="compressed_segmentation", block_size=(4, 4, 2), zero_cells=((2, 1, 1),)),
        TsScale("12_12_30", (17, 10, 5), (3, -2, -1), (8, 8, 4), (12, 12, 30), None,
                encoding="compressed_segmentation", block_size=(3, 4, 2), zero_cells=((0, 1, 0),)),
        TsScale("24_24_30", (9, 5, 3), (1, -1, -1), (4, 4, 2), (24, 24, 30),
                sharding("identity", preshift=0, minishard=1, shard=1, index="raw", data="gzip"), zero_cells=((1, 0, 0),)),
    ])
    u64 = TsDataset("pa_u64", "segmentation", "uint64", [
        TsScale("8_8_8", (30, 21, 13), (0, 0, 0), (8, 8, 8), (8, 8, 8),
                sharding("identity", preshift=0, minishard=2, shard=2, index="raw", data="gzip"),
                encoding="compressed_segmentation", block_size=(8, 8, 8), zero_cells=((3, 2, 1),)),
        TsScale("16_16_16", (15, 11, 7), (0, 0, 0), (8, 8, 4), (16, 16, 16),
                sharding("murmurhash3_x86_128", preshift=1, minishard=1, shard=1, index="gzip", data="gzip"),
                zero_cells=((0, 0, 1),)),
        TsScale("32_32_32", (8, 6, 4), (0, 0, 0), (4, 4, 4), (32, 32, 32), None, zero_cells=((1, 1, 0),)),
    ])
    u16 = TsDataset("pa_u16x2", "image", "uint16", [
        TsScale("2_2_2", (21, 9, 10), (5, 6, 7), (8, 4, 4), (2, 2, 2),
                sharding("identity", preshift=0, minishard=1, shard=1, index="raw", data="raw"), zero_cells=((2, 2, 2),)),
        TsScale("4_4_4", (11, 5, 5), (2, 3, 3), (4, 4, 4), (4, 4, 4), None),
    ], num_channels=2)
    seg2 = TsDataset("pa_seg2", "segmentation", "uint64", [
        TsScale("1_1_1", (19, 10, 6), (0, 0, 0), (8, 8, 4), (1, 1, 1),
                sharding("murmurhash3_x86_128", preshift=0, minishard=1, shard=1, index="gzip", data="raw"),
                encoding="compressed_segmentation", block_size=(8, 4, 4), zero_cells=((1, 0, 0),)),
    ], num_channels=2)
    # image encodings (tensorstore writes jpeg with quality 75; both readers decode the same bytes)
    rgb = TsDataset("pa_jpeg", "image", "uint8", [
        TsScale("1_1_1", (21, 17, 6), (-3, 0, 2), (8, 8, 4), (1, 1, 1),
                sharding("murmurhash3_x86_128", preshift=0, minishard=1, shard=1, index="gzip", data="raw"),
                encoding="jpeg", zero_cells=((1, 1, 0),)),
        TsScale("2_2_1", (11, 9, 6), (-2, 0, 2), (8, 8, 4), (2, 2, 1), None, encoding="jpeg"),
    ], num_channels=3)
    gray = TsDataset("pa_gray", "image", "uint8", [
        TsScale("1_1_1", (20, 13, 7), (0, 0, 0), (8, 8, 4), (1, 1, 1), None, encoding="jpeg", zero_cells=((0, 0, 0),)),
        TsScale("2_2_2", (10, 7, 4), (0, 0, 0), (4, 4, 4), (2, 2, 2),
                sharding("identity", preshift=0, minishard=1, shard=1, index="raw", data="gzip"), encoding="png"),
    ])
    png16 = TsDataset("pa_png16", "image", "uint16", [
        TsScale("3_3_3", (13, 10, 5), (0, 0, 0), (8, 4, 4), (3, 3, 3),
                sharding("identity", preshift=1, minishard=1, shard=1, index="gzip", data="gzip"),
                encoding="png", zero_cells=((1, 2, 1),)),
        TsScale("6_6_6", (7, 5, 3), (0, 0, 0), (4, 4, 2), (6, 6, 6), None, encoding="png"),
    ], num_channels=2)
    rng = np.random.default_rng(2026)
    out = [u8, u32, u64, u16, seg2, rgb, gray, png16]
    for ds in out:
        for s in ds.scales:
            ds.data.append(_fill(rng, ds, s))
    return out


def scales_of(datasets: dict[str, TsDataset]) -> list[tuple[str, int]]:
    """(dataset name, scale index) of every scale, for parametrizing."""
    return [(name, i) for name, ds in datasets.items() for i in range(len(ds.scales))]


def scale_ids(datasets: dict[str, TsDataset]) -> list[str]:
    """Test ids of `scales_of(datasets)`: dataset name and scale key."""
    return [f"{name}:{datasets[name].scales[i].key}" for name, i in scales_of(datasets)]


def write_datasets(root: Path, datasets: dict[str, TsDataset]) -> Path:
    """Every dataset under `root/<name>`."""
    for ds in datasets.values():
        write_ts_dataset(root / ds.name, ds)
    return root


def _fill(rng, ds: TsDataset, s: TsScale) -> np.ndarray:
    shape = (*s.size, ds.num_channels)
    dtype = np.dtype(ds.dtype)
    if ds.type == "image":
        a = rng.integers(1, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    else:  # blocky labels, some above 2**32 for uint64, so compressed_segmentation has tables
        small = rng.integers(1, 7, tuple(-(-n // 3) for n in s.size) + (ds.num_channels,)).astype(dtype)
        a = np.repeat(np.repeat(np.repeat(small, 3, 0), 3, 1), 3, 2)[: s.size[0], : s.size[1], : s.size[2]]
        a = a * dtype.type(1000003 if dtype.itemsize == 4 else 2**40 + 3)
        noisy = rng.random(shape) < 0.05  # a few scattered labels
        a[noisy] = rng.integers(1, 2**31, int(noisy.sum())).astype(dtype)
        # one chunk of all-distinct labels: blocks with 8- and 16-bit encoded values
        first = tuple(slice(0, k) for k in s.chunk_size)
        a[first] = rng.permutation(a[first].size).reshape(a[first].shape).astype(dtype) + 1
    for cell in s.zero_cells:
        a[tuple(slice(c * k, (c + 1) * k) for c, k in zip(cell, s.chunk_size))] = 0
    return np.ascontiguousarray(a)
