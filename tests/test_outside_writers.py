"""Data written by tools outside the project, through the N5 and Zarr v2 views (issue 23,
points 11-14), read by independent readers and compared with the original.

Fixtures (tests/writers_outside.py): CF data written by xarray (time x lat x lon, `units`,
`scale_factor`/`add_offset`, NaN fill, scalar coordinates, consolidated metadata, shards),
sharded arrays written by tensorstore (zstd with checksums; a Fortran-ordered one), and an
OME-Zarr 0.5 HCS plate with labels written by ome-zarr-py (its own venv). Readers:
tensorstore's `n5` and `zarr` drivers and xarray here, zarr-python 2.18 in the legacy venv;
the originals are read by zarr-python 3 and xarray.

- 11: CF's `units: "K"` was copied onto N5's `units`, which tensorstore's n5 driver refuses.
- 12: tensorstore's zarr driver refused the zarr2 view's `"checksum"` member of zstd.
- 13: xarray read the zarr2 view's `fill_value` as `_FillValue` (uint8 zeros NaN, time[0]
  NaT) and could not open a dataset with scalar coordinates at all.
- 14: nothing in `attributes.json` said which N5 dimension is which axis of the array.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import writers_outside as W
from conftest import zvfs_mount
from test_legacy_tools import legacy_venvs, run_in  # noqa: F401 - legacy_venvs is a fixture
from test_zarr_conformance import assert_same_array

pytestmark = pytest.mark.mount

#: names a stored attribute must never take in the N5 view (what the issue names; the view's
#: own list is longer)
N5_NAMES = {"dimensions", "blockSize", "dataType", "compression", "units", "resolution", "axes", "pixelResolution",
            "downsamplingFactors", "scales", "multiScale", "n5"}


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cf_store(tmp_path_factory) -> Path:
    pytest.importorskip("xarray", reason="xarray (the test extra) writes the CF fixtures")
    root = tmp_path_factory.mktemp("cf") / "era.zarr"
    W.write_cf_dataset(root)
    return root


@pytest.fixture(scope="module")
def ts_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ts") / "variants.zarr"
    W.write_tensorstore_variants(root)
    return root


@pytest.fixture(scope="module")
def plate_store(tmp_path_factory, legacy_venvs) -> Path:  # noqa: F811 - the fixture imported above
    root = tmp_path_factory.mktemp("hcs") / "plate.ome.zarr"
    run_in(legacy_venvs / "ome05", W.WRITE_HCS_PLATE, root)
    return root


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    """mounted(store, view): the store mounted with that view, once per module."""
    with contextlib.ExitStack() as stack:
        mounts: dict[tuple[str, str], Path] = {}

        def mount(src: Path, view: str) -> Path:
            if (str(src), view) not in mounts:
                base = tmp_path_factory.mktemp(f"mnt-{src.stem}-{view}")
                mounts[str(src), view] = stack.enter_context(
                    zvfs_mount(src, base / "mnt", log=base / "zvfs.log", options=(f"view={view}",)))
            return mounts[str(src), view]

        yield mount


def original_arrays(root: Path) -> dict[str, tuple[np.ndarray, dict, list | None]]:
    """Every array of the original, read by zarr-python 3: path -> (values as stored,
    attributes, dimension names)."""
    import zarr

    out = {}
    for path, a in zarr.open_group(str(root), mode="r").members(max_depth=None):
        if isinstance(a, zarr.Array):
            names = a.metadata.dimension_names
            out[path] = (np.asarray(a[...]), dict(a.attrs), list(names) if names else None)
    return out


def ts_read(driver: str, path: Path) -> np.ndarray:
    import tensorstore as ts

    t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path)},
                 "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
    return np.asarray(t.read().result())


def in_array_order(n5_values: np.ndarray, axis_order: list[int]) -> np.ndarray:
    """An N5 dataset read in N5's dimension order, put back in the array's axis order by what
    its attributes say (`zarr.axis_order[i]`: the array axis that N5 dimension i is)."""
    return np.transpose(n5_values, np.argsort(axis_order))


READ_V2_TREE = r'''
import json, os, sys, numpy as np, zarr
assert zarr.__version__.startswith("2.18"), zarr.__version__
mnt, out = sys.argv[1], sys.argv[2]
found = {}
def save(path, a):
    f = os.path.join(out, f"{len(found)}.npy")
    np.save(f, a[...])
    found[path] = {"npy": f, "fill_value": None if a.fill_value is None else np.asarray(a.fill_value).tolist()}
root = zarr.open(mnt, mode="r")
if isinstance(root, zarr.Array):
    save("", root)
else:
    root.visititems(lambda path, node: save(path, node) if isinstance(node, zarr.Array) else None)
json.dump(found, open(os.path.join(out, "found.json"), "w"))
'''

READ_N5_ZARR218 = r'''
import json, os, sys, numpy as np, zarr
from zarr.n5 import N5FSStore
assert zarr.__version__.startswith("2.18"), zarr.__version__
mnt, out, paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
found = {}
for path in paths:
    a = zarr.open_array(store=N5FSStore(mnt), path=path, mode="r")
    f = os.path.join(out, f"n5-{len(found)}.npy")
    np.save(f, a[...])
    found[path] = {"npy": f, "attrs": a.attrs.asdict()}
json.dump(found, open(os.path.join(out, "found.json"), "w"))
'''


def zarr218(venvs: Path, code: str, mnt: Path, out: Path, *args) -> dict:
    """Run `code` (a reader above) with zarr-python 2.18 in the ome04 venv; what it found."""
    out.mkdir(exist_ok=True)
    run_in(venvs / "ome04", code, mnt, out, *args)
    return json.loads((out / "found.json").read_text())


# ------------------------------------------------------------------------------ 11: N5 names


def test_cf_attributes_never_take_n5_names(cf_store, mounted, legacy_venvs, tmp_path):  # noqa: F811
    """CF variables with `units` open in tensorstore's n5 driver and zarr-python 2.18's N5
    store, read like the original; every stored attribute is still there, those of an N5
    name under `zarr.attributes`."""
    mnt = mounted(cf_store, "n5")
    arrays = original_arrays(cf_store)
    shown = [p for p, (v, _, _) in arrays.items() if v.ndim]  # N5 has no 0-d datasets
    assert any("units" in arrays[p][1] for p in shown)
    for path in shown:
        want, attrs, _ = arrays[path]
        n5 = json.loads((mnt / path / "attributes.json").read_text())
        assert_same_array(in_array_order(ts_read("n5", mnt / path), n5["zarr"]["axis_order"]), want,
                          f"tensorstore n5 {path}")
        moved = n5["zarr"].get("attributes", {})
        for key, value in attrs.items():
            assert (moved if key in N5_NAMES else n5)[key] == value, (path, key)
        assert not set(moved) - N5_NAMES, (path, moved)
    found = zarr218(legacy_venvs, READ_N5_ZARR218, mnt, tmp_path / "z2", json.dumps(shown))
    for path in shown:  # zarr-python 2's N5 store shows the C-ordered datasets in the array's order
        assert_same_array(np.load(found[path]["npy"]), arrays[path][0], f"zarr 2.18 N5 {path}")
        assert found[path]["attrs"]["zarr"].get("attributes", {}).get("units") == arrays[path][1].get("units"), path


def test_group_attributes_of_n5_names_are_kept_aside(tmp_path):
    """Attributes of N5 names on groups (the root's `n5` too) and arrays move under `zarr`,
    never replace the view's own keys, and nothing else moves."""
    import zarr

    root = zarr.open_group(tmp_path / "s.zarr", mode="w", zarr_format=3,
                           attributes={"n5": "9.9.9", "units": "K", "scales": [1], "keep": 1})
    a = root.create_array("a", shape=(10, 6), chunks=(5, 3), shards=(10, 6), dtype="uint16", fill_value=0,
                          attributes={"dimensions": [99], "dataType": "float64", "resolution": [4, 4],
                                      "zarr": "mine", "keep": 2})
    a[...] = np.arange(60, dtype="uint16").reshape(10, 6)
    with zvfs_mount(tmp_path / "s.zarr", tmp_path / "mnt", options=("view=n5",)) as mnt:
        group = json.loads((mnt / "attributes.json").read_text())
        dataset = json.loads((mnt / "a" / "attributes.json").read_text())
        got = ts_read("n5", mnt / "a")
    assert group == {"n5": "2.0.0", "keep": 1, "zarr": {"attributes": {"n5": "9.9.9", "units": "K", "scales": [1]}}}
    assert dataset["dimensions"] == [6, 10] and dataset["dataType"] == "uint16" and "resolution" not in dataset
    assert dataset["keep"] == 2 and dataset["zarr"] == {
        "axis_order": [1, 0], "attributes": {"dimensions": [99], "dataType": "float64", "resolution": [4, 4], "zarr": "mine"}}
    assert np.array_equal(got.T, np.arange(60, dtype="uint16").reshape(10, 6))


# ------------------------------------------------------------------------------ 12: zstd in v2


def test_tensorstore_zstd_chunks_in_the_zarr2_view(ts_store, mounted, legacy_venvs, tmp_path):  # noqa: F811
    mnt = mounted(ts_store, "zarr2")
    arrays = original_arrays(ts_store)
    assert sorted(arrays) == sorted(W.TS_VARIANTS)
    for name, (want, _, _) in arrays.items():
        zarray = json.loads((mnt / name / ".zarray").read_text())
        assert zarray["compressor"]["id"] == "zstd" and "checksum" not in zarray["compressor"], zarray
        assert_same_array(ts_read("zarr", mnt / name), want, f"tensorstore zarr {name}")
        assert_same_array(ts_read("zarr3", ts_store / name), want, f"tensorstore zarr3 original {name}")
    found = zarr218(legacy_venvs, READ_V2_TREE, mnt, tmp_path / "z2")
    for name, (want, _, _) in arrays.items():
        assert_same_array(np.load(found[name]["npy"]), want, f"zarr 2.18 {name}")


# ------------------------------------------------------------------------------ 13: xarray


def open_xarray(path: Path, group: str):
    import xarray as xr

    with warnings.catch_warnings():  # zarr's v3 consolidated metadata; v2 without .zmetadata
        warnings.simplefilter("ignore")
        return xr.open_zarr(str(path), group=group or None).load()


@pytest.mark.parametrize("group", list(W.CF_VARIABLES), ids=lambda g: g or "root")
def test_xarray_reads_the_zarr2_view_as_the_original(cf_store, mounted, group):
    """The root: values equal to the stored fill value (uint8 zeros, time[0]) were masked;
    `ensemble`: a dataset with scalar coordinates did not open at all."""
    import xarray as xr

    mnt = mounted(cf_store, "zarr2")
    want, got = open_xarray(cf_store, group), open_xarray(mnt, group)
    assert set(want.variables) == set(W.CF_VARIABLES[group])
    for name in W.CF_VARIABLES[group]:  # the failures the issue names, one by one, before the whole
        assert got[name].dtype == want[name].dtype, name
        assert_same_array(got[name].values, want[name].values, f"xarray {group}/{name}")
    xr.testing.assert_identical(got, want)


def test_cf_arrays_read_like_the_original_in_v2_readers(cf_store, mounted, legacy_venvs, tmp_path):  # noqa: F811
    """The raw values through zarr-python 2.18 and tensorstore's zarr driver: the chunks of CF
    variables that are not stored are fill chunks of the original's fill value."""
    mnt = mounted(cf_store, "zarr2")
    arrays = original_arrays(cf_store)
    found = zarr218(legacy_venvs, READ_V2_TREE, mnt, tmp_path / "z2")
    assert sorted(found) == sorted(arrays)
    for path, (values, _, _) in arrays.items():
        assert_same_array(np.load(found[path]["npy"]), values, f"zarr 2.18 {path}")
        assert_same_array(ts_read("zarr", mnt / path), values, f"tensorstore zarr {path}")


def test_xarray_fill_values_are_those_of_xarrays_v2_writer(cf_store, mounted, tmp_path):
    """Each CF variable's v2 `fill_value` is the one xarray's own v2 writer gives the same
    data: its `_FillValue`, or null without one (NaN stays NaN)."""
    mnt = mounted(cf_store, "zarr2")
    v2 = tmp_path / "era-v2.zarr"
    W.write_cf_dataset(v2, zarr_format=2)
    for group, names in W.CF_VARIABLES.items():
        for name in names:
            path = f"{group}/{name}" if group else name
            assert json.loads((mnt / path / ".zarray").read_text())["fill_value"] == \
                json.loads((v2 / path / ".zarray").read_text())["fill_value"], path


# ------------------------------------------------------------------------------ 14: axis order


def test_n5_attributes_say_the_zarr_axis_order(cf_store, ts_store, plate_store, mounted):
    """For every dataset, `zarr.axis_order` and the N5 `axes` say which array axis each N5
    dimension is: C-ordered arrays (CF, the plate) reversed, the Fortran-ordered one kept; a
    reader that follows them reads the original."""
    orders = set()
    for store in (cf_store, ts_store, plate_store):
        mnt = mounted(store, "n5")
        for path, (want, _, names) in original_arrays(store).items():
            if not want.ndim:
                continue
            n5 = json.loads((mnt / path / "attributes.json").read_text())
            order = n5["zarr"]["axis_order"]
            assert sorted(order) == list(range(want.ndim)), (path, order)
            assert n5["dimensions"] == [want.shape[a] for a in order], path
            assert n5.get("axes") == ([names[a] for a in order] if names else None), path
            assert_same_array(in_array_order(ts_read("n5", mnt / path), order), want, f"n5 {store.name}/{path}")
            if want.ndim > 1:
                orders.add("kept" if order == sorted(order) else "reversed" if order == sorted(order)[::-1] else "other")
    assert orders == {"kept", "reversed"}


# ------------------------------------------------------------------------------ the HCS plate


def test_hcs_plate_with_labels_in_the_zarr2_view(plate_store, mounted, legacy_venvs, tmp_path):  # noqa: F811
    """Every image and label array of the plate reads like the original in tensorstore's zarr
    driver and zarr-python 2.18; microscopy arrays (no CF attributes) keep their fill value."""
    mnt = mounted(plate_store, "zarr2")
    arrays = original_arrays(plate_store)
    assert any("/labels/" in p for p in arrays) and len(arrays) > 8
    found = zarr218(legacy_venvs, READ_V2_TREE, mnt, tmp_path / "z2")
    assert sorted(found) == sorted(arrays)
    for path, (want, _, _) in arrays.items():
        assert_same_array(ts_read("zarr", mnt / path), want, f"tensorstore zarr {path}")
        assert_same_array(np.load(found[path]["npy"]), want, f"zarr 2.18 {path}")
        assert found[path]["fill_value"] == 0, (path, found[path]["fill_value"])
    plate = json.loads((mnt / ".zattrs").read_text())["plate"]
    assert plate["version"] == "0.4" and [w["path"] for w in plate["wells"]] == ["A/1", "B/2"]


def test_hcs_plate_with_labels_in_the_n5_view(plate_store, mounted):
    """No group or dataset of the plate carries an N5-named attribute of its own; the OME
    blocks stay where N5 tools that read OME-NGFF look for them."""
    mnt = mounted(plate_store, "n5")
    for dirpath, _, files in os.walk(mnt):
        if "attributes.json" not in files:
            continue
        attrs = json.loads((Path(dirpath) / "attributes.json").read_text())
        assert "attributes" not in attrs.get("zarr", {}), (dirpath, attrs["zarr"])
    assert json.loads((mnt / "attributes.json").read_text())["plate"]["wells"][0]["path"] == "A/1"
    assert "well" in json.loads((mnt / "A" / "1" / "attributes.json").read_text())
    assert "image-label" in json.loads((mnt / "A" / "1" / "0" / "labels" / "nuclei" / "attributes.json").read_text())
