"""Neuroglancer precomputed volumes through the Zarr v3, Zarr v2 and N5 views, real mounts.

Writer: tensorstore's `neuroglancer_precomputed` driver (`writers_precomputed.array_datasets`:
raw and compressed_segmentation, uint8/16/32/64, 1 and 2 channels, unsharded and sharded
with both hashes and both encodings, partial edge chunks, chunks never written). Readers:
tensorstore's `zarr3`, `zarr` and `n5` drivers on the mount, compared with tensorstore's
`neuroglancer_precomputed` driver on the original. Every array is (x, y, z, channel) in all
three views, as the precomputed driver indexes it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import zvfs_mount
import writers_precomputed as wp

pytestmark = pytest.mark.mount

DATASETS = {ds.name: ds for ds in wp.array_datasets()}
SCALES = wp.scales_of(DATASETS)
SCALE_IDS = wp.scale_ids(DATASETS)
VIEWS = ("zarr", "zarr2", "n5")
DRIVER = {"zarr": "zarr3", "zarr2": "zarr", "n5": "n5"}
#: the metadata file of an array, and where its user attributes are, per view
ATTRS = {"zarr": ("zarr.json", lambda m: m["attributes"]), "zarr2": (".zattrs", lambda m: m),
         "n5": ("attributes.json", lambda m: m)}
META_NAMES = {"zarr.json", ".zarray", ".zattrs", ".zgroup", "attributes.json"}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    return wp.write_datasets(tmp_path_factory.mktemp("pa-views"), DATASETS)


@pytest.fixture(scope="module")
def mounts(written, tmp_path_factory):
    stack = contextlib.ExitStack()
    made: dict[tuple[str, str], Path] = {}

    def get(name: str, view: str) -> Path:
        if (name, view) not in made:
            base = tmp_path_factory.mktemp(f"mnt-{view}-{name}")
            made[name, view] = stack.enter_context(zvfs_mount(written / name, base / "mnt", log=base / "zvfs.log",
                                                              options=(f"view={view}",)))
        return made[name, view]

    with stack:
        yield get


def original(written: Path, name: str, key: str) -> np.ndarray:
    return np.asarray(wp.ts_open(written / name, key).read().result())


def read_view(path: Path, view: str) -> np.ndarray:
    import tensorstore as ts

    t = ts.open({"driver": DRIVER[view], "kvstore": {"driver": "file", "path": str(path) + "/"}, "open": True,
                 "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()
    return np.asarray(t.read().result())


def chunk_files(array_dir: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(array_dir) for f in files if f not in META_NAMES]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("sc", SCALES, ids=SCALE_IDS)
def test_view_reads_like_the_precomputed_driver(written, mounts, sc, view):
    name, i = sc
    ds, scale = DATASETS[name], DATASETS[name].scales[i]
    mnt = mounts(name, view)
    want = original(written, name, scale.key)
    got = read_view(mnt / scale.key, view)
    assert got.shape == want.shape == (*scale.size, ds.num_channels)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want, err_msg=f"{view} {name}:{scale.key}")


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("name", DATASETS)
def test_view_metadata_names_the_axes_and_scales(written, mounts, name, view):
    info = json.loads((written / name / "info").read_text())
    mnt = mounts(name, view)
    first = info["scales"][0]["resolution"]
    for meta in info["scales"]:
        fname, user = ATTRS[view]
        m = json.loads((mnt / meta["key"] / fname).read_text())
        attrs = user(m)
        names = {"zarr": lambda: m["dimension_names"], "zarr2": lambda: attrs["_ARRAY_DIMENSIONS"], "n5": lambda: attrs["axes"]}[view]()
        assert list(names) == ["x", "y", "z", "channel"]
        # tensorstore's n5 driver reads `resolution` as one unit per dimension: the channel's is 1
        assert attrs["resolution"] == meta["resolution"] + ([1] if view == "n5" else [])
        assert attrs["voxel_offset"] == meta["voxel_offset"]
        assert attrs["pixelResolution"] == {"unit": "nm", "dimensions": meta["resolution"]}
        assert attrs["downsamplingFactors"] == [r / r0 for r, r0 in zip(meta["resolution"], first)]
        if view == "n5":
            assert m["dimensions"] == [*meta["size"], info["num_channels"]]
            assert m["blockSize"] == [*meta["chunk_sizes"][0], info["num_channels"]]
    assert sorted(p.name for p in mnt.iterdir() if p.is_dir()) == sorted(s["key"] for s in info["scales"])


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("name", DATASETS)
def test_chunk_files_are_the_written_chunks_with_exact_sizes(mounts, name, view):
    """One file per chunk tensorstore wrote (never for a chunk it did not), and every file
    holds exactly its st_size bytes."""
    ds = DATASETS[name]
    mnt = mounts(name, view)
    for scale in ds.scales:
        grid = [-(-s // c) for s, c in zip(scale.size, scale.chunk_size)]
        files = chunk_files(mnt / scale.key)
        assert len(files) == np.prod(grid) - len(scale.zero_cells), scale.key
        for f in files:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                assert len(fh.read()) == size, f


def test_raw_interior_chunks_pass_through(written, mounts):
    """A raw chunk of an unsharded raw scale is the view's chunk as stored (Zarr v3)."""
    scale = DATASETS["pa_u8"].scales[0]
    assert scale.sharding is None and scale.encoding == "raw"
    mnt = mounts("pa_u8", "zarr")
    meta = json.loads((mnt / scale.key / "zarr.json").read_text())
    sep = meta["chunk_key_encoding"].get("configuration", {}).get("separator", "/")
    prefix = ["c"] if meta["chunk_key_encoding"]["name"] == "default" else []
    cell = (1, 1, 1)
    name = "_".join(f"{o + g * c}-{o + (g + 1) * c}" for o, g, c in zip(scale.voxel_offset, cell, scale.chunk_size))
    stored = (written / "pa_u8" / scale.key / name).read_bytes()
    assert (mnt / scale.key / sep.join([*prefix, *map(str, cell), "0"])).read_bytes() == stored
