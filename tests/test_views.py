"""The N5 and Zarr v2 views of the Zarr fixture stores (and of a ZVF store), through real mounts.

Which arrays each view can express is decided here from the fixture cases, independently of
zvfs: Zarr v2 needs at most one compressor and no transpose other than a full reversal (order
"F"); N5 needs a rank >= 1 and an N5 data type. Arrays shown as stored (not unshardable) are
in neither. Readers: tensorstore's `n5` driver (N5 axes are reversed), zarr-python with
`zarr_format=2` and tensorstore's `zarr` driver, each compared with the data written.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import writers
from conftest import WRITER_ARRAYS, run_zvfs, writer_array_id, zvfs_mount
from test_zarr_conformance import assert_same_array

pytestmark = pytest.mark.mount


def zarr2_expressible(case: writers.Case) -> bool:
    if case.stored_as_is:
        return False
    t = case.transpose
    return t is None or list(t) == list(reversed(range(len(case.shape))))


def n5_expressible(case: writers.Case) -> bool:
    return not case.stored_as_is and len(case.shape) > 0


def n5_fortran(case: writers.Case) -> bool:
    """N5 lists dimensions fastest-varying first: the reversed axes of a C-ordered array, the
    array's own axes when its chunks are Fortran-ordered (a fully reversing transpose)."""
    t, n = case.transpose, len(case.shape)
    return t is not None and n > 1 and list(t) == list(reversed(range(n)))


@pytest.fixture(scope="session")
def view_mounts(stores, tmp_path_factory):
    stack = contextlib.ExitStack()
    made = {}

    def get(writer: str, view: str, options=()) -> Path:
        key = (writer, view, options)
        if key not in made:
            base = tmp_path_factory.mktemp(f"mnt-{view}-{writer}")
            made[key] = stack.enter_context(zvfs_mount(stores.root(writer), base / "mnt", log=base / "zvfs.log",
                                                       options=(f"view={view}", *options)))
        return made[key]

    with stack:
        yield get


def read_n5(path: Path, fortran: bool = False) -> np.ndarray:
    import tensorstore as ts

    t = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(path)},
                 "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
    got = np.asarray(t.read().result())
    return got if fortran else got.T  # N5 lists dimensions fastest-first


def read_v2_zarr_python(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r", zarr_format=2)[...])


def read_v2_tensorstore(path: Path) -> np.ndarray:
    import tensorstore as ts

    t = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)},
                 "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
    return np.asarray(t.read().result())


def n5_path(path: str) -> str:
    """The N5 view names OME multiscale levels s0, s1, ... (what N5 multiscale readers open)."""
    parent, _, name = path.rpartition("/")
    return f"{parent}/s{name}" if parent in ("ome", "ome/labels/cells") and name.isdigit() else path


def _want(stores, writer, path) -> np.ndarray:
    info = stores.infos(writer)[path]
    return info.data


@pytest.mark.parametrize("compression", ["raw", "gzip", "zstd", "blosc"])
@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_n5_view_reads_like_the_data_written(stores, view_mounts, wa, compression):
    writer, path = wa
    case = writers.CASES_BY_PATH[path]
    mnt = view_mounts(writer, "n5", () if compression == "raw" else (f"n5_compression={compression}",))
    if not n5_expressible(case):
        assert not (mnt / n5_path(path)).exists(), f"{path} should be absent from the N5 view"
        return
    attrs = json.loads((mnt / n5_path(path) / "attributes.json").read_text())
    order = (lambda x: list(x)) if n5_fortran(case) else (lambda x: list(reversed(x)))
    assert attrs["dimensions"] == order(case.shape)
    assert attrs["dataType"] == case.dtype
    if case.dimension_names:
        assert attrs["axes"] == order(case.dimension_names)
    assert_same_array(read_n5(mnt / n5_path(path), n5_fortran(case)), _want(stores, writer, path), f"n5 {path}")


@pytest.mark.parametrize("reader", ["zarr-python", "tensorstore"])
@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_zarr2_view_reads_like_the_data_written(stores, view_mounts, wa, reader):
    writer, path = wa
    case = writers.CASES_BY_PATH[path]
    mnt = view_mounts(writer, "zarr2")
    if not zarr2_expressible(case):
        assert not (mnt / path).exists(), f"{path} should be absent from the Zarr v2 view"
        return
    meta = json.loads((mnt / path / ".zarray").read_text())
    assert meta["zarr_format"] == 2 and meta["shape"] == list(case.shape)
    if case.dimension_names:
        assert json.loads((mnt / path / ".zattrs").read_text())["_ARRAY_DIMENSIONS"] == list(case.dimension_names)
    read = read_v2_zarr_python if reader == "zarr-python" else read_v2_tensorstore
    got = read(mnt / path)
    if case.data_endian == "big":  # v2 keeps the byte order in the dtype (">u2"): values must agree
        got = got.astype(got.dtype.newbyteorder("="))
    assert_same_array(got, _want(stores, writer, path), f"zarr2 {path}")


@pytest.mark.parametrize("view", ["n5", "zarr2"])
def test_ome_group_attributes_in_both_views(stores, view_mounts, view):
    import zarr

    for writer in writers.WRITERS:
        mnt = view_mounts(writer, view)
        want = dict(zarr.open_group(str(stores.root(writer) / "ome"), mode="r").attrs)
        name = "attributes.json" if view == "n5" else ".zattrs"
        got = json.loads((mnt / "ome" / name).read_text())
        # OME-Zarr 0.5 -> the 0.4 form (blocks at the top level, multiscales versioned 0.4)
        ome = want["ome"]
        assert got["multiscales"][0]["version"] == "0.4" and "ome" not in got
        assert got["multiscales"][0]["axes"] == ome["multiscales"][0]["axes"]
        if view == "n5":
            assert got["multiScale"] is True and got["scales"] == [[1, 1, 1], [2, 2, 2], [4, 4, 4]]
        for level in (("s0", "s1", "s2", "labels/cells/s0") if view == "n5" else ("0", "1", "2", "labels/cells/0")):
            assert (mnt / "ome" / level).is_dir()
    if view == "n5":
        assert json.loads((view_mounts(writers.WRITERS[0], "n5") / "attributes.json").read_text())["n5"] == "2.0.0"


def test_n5_blocks_pass_through_or_are_transcoded(stores, view_mounts):
    """A one-byte zstd array keeps its compression (bytes pass through behind the header);
    a little-endian gzip array is transcoded to raw big-endian blocks of exact size."""
    mnt = view_mounts("zarr-python", "n5")
    ome = json.loads((mnt / "ome" / "s0" / "attributes.json").read_text())
    assert ome["compression"]["type"] == "raw"  # uint16 little-endian: transcoded
    d3 = json.loads((mnt / "dims" / "d3" / "attributes.json").read_text())
    assert d3["compression"]["type"] == "raw" and d3["dataType"] == "uint8"
    big = json.loads((mnt / "dtypes" / "uint16_bigendian_data" / "attributes.json").read_text())
    assert big["compression"]["type"] == "raw"
    # a transcoded end block is cropped: dims in its header are the cropped block size
    # shape (20, 27) in 4x5 chunks: grid (5, 6); the last block is grid (4, 5), path "5/4", and
    # its x extent is cropped to 27 - 25 = 2
    block = mnt / "dtypes" / "uint16_gzip" / "5" / "4"
    data = block.read_bytes()
    ndim = int.from_bytes(data[2:4], "big")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    assert dims == [2, 4] and len(data) == os.stat(block).st_size == 4 + 4 * ndim + 2 * 4 * 2


def test_inspect_lists_arrays_absent_from_a_view(stores):
    r = run_zvfs("inspect", "--json", "--view", "zarr2", stores.root("zarr-python"))
    assert r.returncode == 0, r.stderr
    arrays = {a["path"]: a for a in json.loads(r.stdout)["arrays"]}
    for path, case in writers.CASES_BY_PATH.items():
        assert arrays[path]["in_view"] == zarr2_expressible(case), path


def test_zvf_store_in_the_zarr2_view(tmp_path):
    """Every array of a ZVF store (vlen-bytes cells, zstd) reads through the Zarr v2 view like
    zarr-python reads the sharded original."""
    import zarr
    from zarr_vectors.types.polylines import write_polylines

    rng = np.random.default_rng(5)
    lines = [np.cumsum(rng.normal(0, 8, size=(int(rng.integers(5, 30)), 3)), axis=0).astype("float32") + 100 for _ in range(20)]
    src = tmp_path / "lines.zv"
    write_polylines(str(src), lines, chunk_shape=(50.0, 50.0, 50.0), bounds=([-100, -100, -100], [300, 300, 300]), shard_shape=(2, 2, 2))
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=("view=zarr2",)) as mnt:
        original = zarr.open_group(str(src), mode="r")
        compared = 0
        for path in [p for p, _ in _walk_arrays(original)]:
            want = original[path][...]
            got = zarr.open_array(str(mnt / path), mode="r", zarr_format=2)[...]
            assert want.shape == got.shape and want.dtype.kind == got.dtype.kind, path
            assert all(bytes(a) == bytes(b) for a, b in zip(want.reshape(-1), got.reshape(-1))) if want.dtype == object \
                else np.array_equal(want, got), path
            compared += 1
        assert compared >= 5


def _walk_arrays(group, prefix=""):
    for name, member in group.members():
        path = f"{prefix}{name}"
        if hasattr(member, "shape"):
            yield path, member
        else:
            yield from _walk_arrays(member, path + "/")


def test_n5_keys_are_never_shadowed_by_attributes(tmp_path):
    """User attributes named like N5's own keys neither replace them nor make a group look
    like a dataset."""
    import zarr

    root = zarr.open_group(tmp_path / "s.zarr", mode="w", zarr_format=3,
                           attributes={"n5": "9.9.9", "dimensions": [1], "keep": 1})
    a = root.create_array("a", shape=(10, 6), chunks=(5, 3), shards=(10, 6), dtype="uint16", fill_value=0,
                          attributes={"dimensions": [99], "dataType": "float64", "blockSize": [1], "compression": "x", "keep": 2})
    a[...] = np.arange(60, dtype="uint16").reshape(10, 6)
    with zvfs_mount(tmp_path / "s.zarr", tmp_path / "mnt", options=("view=n5",)) as mnt:
        group = json.loads((mnt / "attributes.json").read_text())
        dataset = json.loads((mnt / "a" / "attributes.json").read_text())
        got = read_n5(mnt / "a")
    assert group == {"n5": "2.0.0", "keep": 1, "zarr": {"attributes": {"n5": "9.9.9", "dimensions": [1]}}}
    assert dataset["dimensions"] == [6, 10] and dataset["dataType"] == "uint16" and dataset["blockSize"] == [3, 5]
    assert dataset["compression"]["type"] == "raw" and dataset["keep"] == 2
    assert np.array_equal(got, np.arange(60, dtype="uint16").reshape(10, 6))
