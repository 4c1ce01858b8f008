"""Conformance: zarr-python and tensorstore read every array through the mount exactly as they
read it from the sharded original; a copy of the mounted tree is a real unsharded store."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import writers
from conftest import WRITER_ARRAYS, writer_array_id

pytestmark = pytest.mark.mount

READERS = ("zarr-python", "tensorstore")

# (reader, array) pairs where the reader cannot read even the original: not applicable
NOT_READABLE = {
    ("zarr-python", "stored/storage_transformer"),
    ("tensorstore", "stored/storage_transformer"),
    ("tensorstore", "stored/bytes_after_sharding"),
}


def read_zarr_python(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r")[...])


def read_tensorstore(path: Path) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)},
            "context": {"cache_pool": {"total_bytes_limit": 0}}}
    return np.asarray(ts.open(spec, open=True, read=True).result().read().result())


READ = {"zarr-python": read_zarr_python, "tensorstore": read_tensorstore}


def assert_same_array(got: np.ndarray, want: np.ndarray, what: str = ""):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    equal_nan = want.dtype.kind in "fc"
    if not np.array_equal(got, want, equal_nan=equal_nan):
        diff = np.argwhere(~((got == want) | (np.isnan(got) & np.isnan(want)) if equal_nan
                             else (got == want)))
        raise AssertionError(f"{what}: {len(diff)} elements differ, first at {diff[:3].tolist()}")


def _original(stores, writer, reader, path) -> np.ndarray:
    """Read the original; check the fixture is what the writer was asked to write."""
    info = stores.infos(writer)[path]
    want = READ[reader](info.directory)
    assert_same_array(want, info.data.astype(want.dtype), f"original {path} vs data written")
    return want


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_reader_reads_mount_like_original(stores, wa, reader):
    writer, path = wa
    if (reader, path) in NOT_READABLE:
        with pytest.raises(Exception):
            READ[reader](stores.infos(writer)[path].directory)
        with pytest.raises(Exception):  # shown as stored: the reader refuses it the same way
            READ[reader](stores.mount(writer) / path)
        return
    want = _original(stores, writer, reader, path)
    got = READ[reader](stores.mount(writer) / path)
    assert_same_array(got, want, f"{reader} through the mount")


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_consolidated_group_reads_through_the_mount(stores, writer):
    import zarr

    mnt = stores.mount(writer)
    g = zarr.open_group(str(mnt / "consolidated"), mode="r", use_consolidated=True)
    assert g.metadata.consolidated_metadata is not None, "mounted group lost its consolidated metadata"
    for name in ("a", "sub/b", "plain"):
        arr = g[name]
        want = _original(stores, writer, "zarr-python", f"consolidated/{name}")
        assert_same_array(np.asarray(arr[...]), want, f"consolidated/{name} via consolidated metadata")
    g2 = zarr.open_consolidated(str(mnt / "consolidated"), mode="r")
    assert_same_array(np.asarray(g2["sub"]["b"][...]),
                      _original(stores, writer, "zarr-python", "consolidated/sub/b"), "open_consolidated")


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_ome_multiscale_group_reads_through_the_mount(stores, writer):
    import zarr

    g = zarr.open_group(str(stores.mount(writer) / "ome"), mode="r")
    ms = g.attrs["ome"]["multiscales"][0]
    for ds in ms["datasets"]:
        want = _original(stores, writer, "zarr-python", f"ome/{ds['path']}")
        assert_same_array(np.asarray(g[ds["path"]][...]), want, f"ome/{ds['path']}")
    labels = g["labels"]
    assert labels.attrs["ome"]["labels"] == ["cells"]
    want = _original(stores, writer, "zarr-python", "ome/labels/cells/0")
    assert_same_array(np.asarray(labels["cells"]["0"][...]), want, "ome/labels/cells/0")


# ----------------------------------------------------------------------------------------------
# cp -r of the mount


class _Copies:
    """`cp -r` of each writer's mounted tree into a real directory (once per writer).

    cp keeps copying past an error, so the per-array tests still run on what was copied; the
    error itself fails test_cp_r_of_the_mount_succeeds.
    """

    def __init__(self, stores, factory):
        self.stores, self.factory, self.done, self.errors = stores, factory, {}, {}

    def __call__(self, writer) -> Path:
        if writer not in self.done:
            dst = self.factory.mktemp(f"copy-{writer}") / "store.zarr"
            r = subprocess.run(["cp", "-r", str(self.stores.mount(writer)), str(dst)],
                               capture_output=True, timeout=300)
            self.done[writer] = dst
            if r.returncode != 0:
                self.errors[writer] = r.stderr.decode(errors="replace")[:2000]
        return self.done[writer]


@pytest.fixture(scope="session")
def copied(stores, tmp_path_factory):
    return _Copies(stores, tmp_path_factory)


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_cp_r_of_the_mount_succeeds(copied, writer):
    copied(writer)
    assert writer not in copied.errors, f"cp -r of the mount failed:\n{copied.errors.get(writer)}"


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_copy_of_mount_has_exactly_the_expected_files(stores, copied, writer):
    dst = copied(writer)
    tree = stores.expected(writer).tree()
    got = {p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()}
    assert got == set(tree), (f"extra {sorted(got - set(tree))[:10]}, "
                              f"missing {sorted(set(tree) - got)[:10]}")
    for rel, want in tree.items():
        raw = (dst / rel).read_bytes()
        if isinstance(want, dict):
            assert json.loads(raw) == want, rel
        else:
            assert raw == want, rel


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_copy_of_mount_is_unsharded_and_reads_like_original(stores, copied, wa, reader):
    writer, path = wa
    case = writers.CASES_BY_PATH[path]
    adir = copied(writer) / path
    meta = json.loads((adir / "zarr.json").read_bytes())
    if case.unshardable:
        assert "sharding_indexed" not in json.dumps(meta["codecs"]), "copy is still sharded"
        assert meta["chunk_grid"]["configuration"]["chunk_shape"] == list(writers.leaf_shape(case))
    if (reader, path) in NOT_READABLE:
        with pytest.raises(Exception):  # refused like the original
            READ[reader](adir)
        return
    want = _original(stores, writer, reader, path)
    assert_same_array(READ[reader](adir), want, f"{reader} on the copy")


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_copy_of_mount_consolidated_group_reads(stores, copied, writer):
    import zarr

    g = zarr.open_group(str(copied(writer) / "consolidated"), mode="r", use_consolidated=True)
    for name in ("a", "sub/b", "plain"):
        assert_same_array(np.asarray(g[name][...]),
                          _original(stores, writer, "zarr-python", f"consolidated/{name}"), name)


# ----------------------------------------------------------------------------------------------
# the unsharded twin (same data written unsharded by the same writer)

UNSHARD_ARRAYS = [(w, c.path) for w in writers.WRITERS for c in writers.CASES if c.unshardable]


def _normalize(b: bytes, case: writers.Case) -> bytes:
    # gzip headers carry the write time (zarr-python): compare without it
    if case.compressor == "gzip" and b[:2] == b"\x1f\x8b":
        return b[:4] + b"\0\0\0\0" + b[8:]
    return b


@pytest.mark.parametrize("wa", UNSHARD_ARRAYS, ids=writer_array_id)
def test_mount_has_the_chunk_files_of_the_unsharded_twin(stores, wa):
    writer, path = wa
    case = writers.CASES_BY_PATH[path]
    _, twin = stores.twin(writer)
    want = twin.arrays[path].files
    adir = stores.mount(writer) / path
    got = {Path(dp, f).relative_to(adir).as_posix()
           for dp, _, fs in os.walk(adir) for f in fs} - {"zarr.json"}
    assert got == set(want), (f"extra {sorted(got - set(want))[:10]}, "
                              f"missing {sorted(set(want) - got)[:10]}")
    for key in sorted(want):
        assert _normalize((adir / key).read_bytes(), case) == _normalize(want[key], case), key


@pytest.mark.parametrize("wa", UNSHARD_ARRAYS, ids=writer_array_id)
def test_reference_metadata_matches_unsharded_twin(stores, wa):
    """Sanity of the tests' reference (no mount): the rewritten zarr.json we expect is what the
    writer itself produces when writing the array unsharded."""
    writer, path = wa
    _, twin = stores.twin(writer)
    assert stores.expected(writer).arrays[path].expected_meta == twin.arrays[path].meta
