"""igneous-written skeletons and meshes through a real zvfs mount (issue 14, point 0).

igneous keeps spatial indexes, `0.labels.gz`, `*.frags` and provenance beside the shards of a
precomputed dataset; cloud-volume's spatial-index queries read them. On the mount every such
file must be listed and read as stored, in every directory, while the shards themselves are
shown unsharded. The dataset is written once per module by igneous (tests/writers_igneous.py);
expectations come from cloud-volume reading the original and from the labels put in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import writers_igneous as wi
from conftest import run_zvfs, zvfs_mount
from writers_precomputed import cloudvolume_env

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def cv_env(tmp_path_factory):
    """cloud-volume reads its cache/lock directories from the environment at import time."""
    with cloudvolume_env(tmp_path_factory.mktemp("igneous-cv-env")):
        yield


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, cv_env) -> Path:
    return wi.write_igneous_dataset(tmp_path_factory.mktemp("igneous"))


@pytest.fixture(scope="module")
def mnt(dataset, tmp_path_factory):
    base = tmp_path_factory.mktemp("igneous-mount")
    with zvfs_mount(dataset, base / "mnt", log=base / "zvfs.log") as mnt:
        yield mnt


def info(root: Path) -> dict:
    import json

    return json.loads((root / "info").read_text())


def object_dirs(root: Path) -> dict[str, str]:
    """kind -> directory, as the dataset's info names them."""
    return {"mesh": info(root)["mesh"], "skeletons": info(root)["skeletons"]}


def sharded_scale(root: Path) -> tuple[int, str]:
    """(mip, key) of the scale igneous wrote sharded."""
    found = [(mip, s["key"]) for mip, s in enumerate(info(root)["scales"]) if s.get("sharding")]
    assert len(found) == 1, found
    return found[0]


def cv_open(root: Path, mip: int = 0):
    from cloudvolume import CloudVolume

    return CloudVolume(f"file://{root}", mip=mip, progress=False, cache=False)


def test_fixture_holds_igneous_own_files_beside_the_shards(dataset):
    """Sanity of the fixture: igneous sharded both directories and left its other files there
    (what a view showing only unsharded names would hide)."""
    for kind, d in object_dirs(dataset).items():
        files = os.listdir(dataset / d)
        assert info(dataset / d).get("sharding"), kind
        for suffix in (".shard", ".spatial.gz", ".frags", "0.labels.gz"):
            assert any(f.endswith(suffix) for f in files), (kind, suffix, files)
    assert (dataset / "provenance").is_file()


@pytest.mark.parametrize("kind", ["mesh", "skeletons"])
def test_every_stored_file_but_the_shards_passes_through(dataset, mnt, kind):
    d = object_dirs(dataset)[kind]
    stored = [f for f in os.listdir(dataset / d) if not f.endswith(".shard") and f != "info"]
    unsharded = {str(label) for label in wi.LABELS}
    if kind == "mesh":
        unsharded |= {f"{label}.index" for label in wi.LABELS}
    assert sorted(os.listdir(mnt / d)) == sorted(set(stored) | unsharded | {"info"})
    r = run_zvfs("ls", "-l", dataset, d)  # the same tree without FUSE (the other listing path)
    assert r.returncode == 0, r.stderr
    listed = dict(line.split()[::-1] for line in r.stdout.decode().splitlines())
    assert sorted(listed) == sorted(os.listdir(mnt / d))
    for f in stored:
        assert int(listed[f]) == os.stat(dataset / d / f).st_size, f
    for f in stored:
        assert (mnt / d / f).read_bytes() == (dataset / d / f).read_bytes(), f
        assert os.stat(mnt / d / f).st_size == os.stat(dataset / d / f).st_size, f
    assert (mnt / "provenance").read_bytes() == (dataset / "provenance").read_bytes()


@pytest.mark.parametrize("kind", ["mesh", "skeletons"])
def test_spatial_index_queries_equal_the_original(dataset, mnt, kind):
    from cloudvolume import Bbox

    attr = {"mesh": "mesh", "skeletons": "skeleton"}[kind]
    orig, mounted = getattr(cv_open(dataset), attr), getattr(cv_open(mnt), attr)
    whole = cv_open(dataset).bounds * cv_open(dataset).resolution
    corner = Bbox((0, 0, 0), whole.maxpt // 2)  # one spatial-index cell of eight
    for bbox in (whole, corner):
        assert mounted.spatial_index.query(bbox) == orig.spatial_index.query(bbox), bbox
    assert orig.spatial_index.query(whole) == set(wi.LABELS)
    assert 0 < len(orig.spatial_index.query(corner)) < len(wi.LABELS)


def test_skeletons_equal_the_original(dataset, mnt):
    orig, mounted = cv_open(dataset), cv_open(mnt)
    for label in wi.LABELS:
        a, b = orig.skeleton.get(label), mounted.skeleton.get(label)
        assert len(a.vertices) > 1
        assert np.array_equal(a.vertices, b.vertices) and np.array_equal(a.edges, b.edges), label
        assert np.array_equal(a.radii, b.radii), label


def test_meshes_equal_the_original(dataset, mnt):
    orig, mounted = cv_open(dataset), cv_open(mnt)
    for label in wi.LABELS:
        a, b = orig.mesh.get(label), mounted.mesh.get(label)
        a, b = a.get(label, a) if isinstance(a, dict) else a, b.get(label, b) if isinstance(b, dict) else b
        assert len(a.faces) > 0
        assert np.array_equal(a.vertices, b.vertices) and np.array_equal(a.faces, b.faces), label


def test_sharded_scale_reads_equal_the_original(dataset, mnt):
    mip, key = sharded_scale(dataset)
    expected = cv_open(dataset, mip)[:, :, :]
    assert np.array_equal(cv_open(mnt, mip)[:, :, :], expected)
    assert set(np.unique(expected)) == {0, *wi.LABELS}
    assert not any(f.endswith(".shard") for f in os.listdir(mnt / key))


# ----------------------------------------------------------------------------------------------
# files igneous does not write, beside the shards of a copy


STALE = b"a stale unsharded file"


@pytest.fixture(scope="module")
def amended(dataset, tmp_path_factory):
    """A copy of the dataset with what users keep beside shards: a README and a directory in
    the sharded scale, stale unsharded files under names the shards hold (a volume chunk, a
    skeleton), and an obsolete `.index` + `.data` pair beside the skeleton shard."""
    root = tmp_path_factory.mktemp("igneous-amended") / "seg"
    shutil.copytree(dataset, root)
    _, key = sharded_scale(root)
    skeletons = object_dirs(root)["skeletons"]
    (root / key / "README").write_bytes(b"written by hand\n")
    (root / key / "notes").mkdir()
    (root / key / "notes" / "a.txt").write_bytes(b"a note\n")
    for name in ("0-32_0-32_0-32", f"../{skeletons}/{wi.LABELS[0]}", f"../{skeletons}/0.index", f"../{skeletons}/0.data"):
        (root / key / name).write_bytes(STALE)
    base = tmp_path_factory.mktemp("igneous-amended-mount")
    with zvfs_mount(root, base / "mnt", log=base / "zvfs.log") as mnt:
        yield root, mnt


def test_other_files_and_directories_pass_through_in_a_sharded_scale(mnt, amended):
    root, amended_mnt = amended
    _, key = sharded_scale(root)
    shown = os.listdir(amended_mnt / key)
    assert len(shown) == len(set(shown))
    assert sorted(shown) == sorted(os.listdir(mnt / key) + ["README", "notes"])
    assert (amended_mnt / key / "README").read_bytes() == (root / key / "README").read_bytes()
    assert os.listdir(amended_mnt / key / "notes") == ["a.txt"]
    assert (amended_mnt / key / "notes" / "a.txt").read_bytes() == (root / key / "notes" / "a.txt").read_bytes()


def test_names_the_shards_hold_show_the_shards_not_stale_files(dataset, amended):
    """Readers of the original read these names from the shards and never see the stale
    files; on the mount the same names must give the same data."""
    root, amended_mnt = amended
    mip, key = sharded_scale(root)
    assert (amended_mnt / key / "0-32_0-32_0-32").read_bytes() != STALE
    assert np.array_equal(cv_open(amended_mnt, mip)[:, :, :], cv_open(dataset, mip)[:, :, :])
    label = wi.LABELS[0]
    a, b = cv_open(dataset).skeleton.get(label), cv_open(amended_mnt).skeleton.get(label)
    assert np.array_equal(a.vertices, b.vertices) and np.array_equal(a.edges, b.edges)


def test_obsolete_shard_pair_is_hidden(amended):
    root, amended_mnt = amended
    skeletons = object_dirs(root)["skeletons"]
    shown = os.listdir(amended_mnt / skeletons)
    assert "0.index" not in shown and "0.data" not in shown
    assert not (amended_mnt / skeletons / "0.index").exists()
    assert not (amended_mnt / skeletons / "0.data").exists()
