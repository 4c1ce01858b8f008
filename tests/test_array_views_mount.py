"""Neuroglancer precomputed volumes through the Zarr v3, Zarr v2 and N5 views, real mounts.

Fixtures: tensorstore writes every volume (writers_precomputed.array_datasets: raw,
compressed_segmentation, jpeg and png, uint8/uint16x2/uint32/uint64, unsharded and sharded with identity
and murmurhash3 hashes, gzip and raw minishard/data encodings, partial edge chunks, chunks
never written); cloud-volume writes a segmentation with sharded skeletons and meshes.
Readers: tensorstore's zarr3 / zarr / n5 drivers reading the mount, compared with its
neuroglancer_precomputed driver reading the original, scale by scale, in the same index order
(x, y, z, channel). `st_size` of every file is what a read returns.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import writers_precomputed as W
from conftest import run_zvfs, zvfs_mount
from test_cli import _one_line
from test_zarr_conformance import assert_same_array

pytestmark = pytest.mark.mount

VIEWS = ("zarr", "zarr2", "n5")
DRIVERS = {"zarr": "zarr3", "zarr2": "zarr", "n5": "n5"}
DATASETS = {ds.name: ds for ds in W.array_datasets()}


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    roots: dict[str, Path] = {}
    made: dict[tuple[str, str], Path] = {}
    with contextlib.ExitStack() as stack:

        def get(name: str, view: str) -> tuple[Path, Path]:
            if name not in roots:
                roots[name] = W.write_ts_dataset(tmp_path_factory.mktemp(f"pa-{name}") / name, DATASETS[name])
            if (name, view) not in made:
                base = tmp_path_factory.mktemp(f"mnt-{name}-{view}")
                made[(name, view)] = stack.enter_context(zvfs_mount(roots[name], base / "mnt", log=base / "zvfs.log",
                                                                    options=(f"view={view}",)))
            return roots[name], made[(name, view)]

        yield get


def ts_read(driver: str, path: Path):
    import tensorstore as ts

    t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path) + "/"},
                 "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()
    return t, np.asarray(t.read().result())


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_tensorstore_reads_the_mount_like_the_original(mounts, name, view):
    root, mnt = mounts(name, view)
    for scale in DATASETS[name].scales:
        want = np.asarray(W.ts_open(root, scale.key).read().result())
        t, got = ts_read(DRIVERS[view], mnt / scale.key)
        assert_same_array(got, want, f"{name}/{scale.key} via {DRIVERS[view]}")
        if view != "zarr2":
            assert list(t.domain.labels) == ["x", "y", "z", "channel"]
        else:
            assert json.loads((mnt / scale.key / ".zattrs").read_text())["_ARRAY_DIMENSIONS"] == ["x", "y", "z", "channel"]


@pytest.mark.parametrize("view", VIEWS)
def test_sizes_are_exact(mounts, view):
    """Every file's st_size (listings included) is the length a read returns."""
    _, mnt = mounts("pa_u32", view)  # compressed_segmentation and gzip: decoded, edges padded or kept
    n = 0
    for d, _, files in os.walk(mnt):
        for f in files:
            p = Path(d) / f
            assert os.stat(p).st_size == len(p.read_bytes()), p
            n += 1
    assert n > 20


def test_skeletons_and_meshes_absent_and_listed_by_inspect(tmp_path):
    with W.cloudvolume_env(tmp_path / "cv"):
        ds = W.write_cv_dataset(tmp_path / "seg")
    info = json.loads((ds.root / "info").read_text())
    with zvfs_mount(ds.root, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=("view=zarr",)) as mnt:
        assert sorted(p.name for p in mnt.iterdir() if p.is_dir()) == sorted(s["key"] for s in info["scales"])
        assert not (mnt / info["mesh"]).exists() and not (mnt / info["skeletons"]).exists()
        want = np.asarray(W.ts_open(ds.root, info["scales"][0]["key"]).read().result())
        _, got = ts_read("zarr3", mnt / info["scales"][0]["key"])
        assert_same_array(got, want, "cloud-volume segmentation via zarr3")
    r = run_zvfs("inspect", "--json", "--view", "zarr", ds.root)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    absent = {a["path"] for a in json.loads(r.stdout)["absent"]}
    assert absent == {info["mesh"], info["skeletons"]}
    assert "ABSENT from the zarr view" in run_zvfs("inspect", "--view", "zarr", ds.root).stdout.decode()


def test_annotation_dataset_refuses_an_array_view(tmp_path):
    root = tmp_path / "ann"
    root.mkdir()
    (root / "info").write_text(json.dumps({
        "@type": "neuroglancer_annotations_v1", "annotation_type": "POINT",
        "dimensions": {"x": [1, "nm"], "y": [1, "nm"], "z": [1, "nm"]},
        "lower_bound": [0, 0, 0], "upper_bound": [10, 10, 10], "properties": [], "relationships": [],
        "by_id": {"key": "by_id"}, "spatial": []}))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_zvfs("mount", root, mnt, "--view", "n5", "-o", f"log={tmp_path / 'log'}")
    assert r.returncode == 2 and "annotations have no array form" in _one_line(r.stderr)
    assert not os.path.ismount(mnt)
