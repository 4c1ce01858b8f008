"""What precomputed datasets have beyond volumes, through the array views, real mounts (the
volumes themselves: test_precomputed_array_views.py).

cloud-volume writes a segmentation with sharded skeletons and meshes: under `--view zarr` the
mount shows the volume scales only (tensorstore's zarr3 driver reads them like its precomputed
driver reads the original), and `zvfs inspect --view zarr` lists what is left out and why. An
annotation dataset has no array at all: an array view refuses the mount with one line, exit 2.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import writers_precomputed as W
from conftest import run_zvfs, zvfs_mount
from test_cli import _one_line
from test_views_offline import annotation_dataset, ts_read
from test_zarr_conformance import assert_same_array

pytestmark = pytest.mark.mount


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
    root = annotation_dataset(tmp_path / "ann")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_zvfs("mount", root, mnt, "--view", "n5", "-o", f"log={tmp_path / 'log'}")
    assert r.returncode == 2 and "annotations have no array form" in _one_line(r.stderr)
    assert not os.path.ismount(mnt)
