"""The fsspec front (protocol `zvfs`), without FUSE: every file and listing against the
reference computed from the original stores (zarr_reference, independent of zvfs); real
readers (zarr-python 3's FsspecStore, xarray.open_zarr, dask.array.from_zarr on a
dask.distributed LocalCluster of two worker processes; zarr-python 2.18's FSStore and mapper
in-process, in the venv `scripts/setup-legacy` makes) against what zarr-python reads from
the sharded originals; the object pickled, shared by threads, forked; chained URLs over a
real HTTP server (nginx) and a real S3 server (moto), with the target's options; an open file
as a snapshot while a writer replaces its shard.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading

import fsspec
import numpy as np
import pytest
import zarr

import writers
from servers import S3, Nginx
from test_legacy_tools import legacy_venvs, run_in  # noqa: F401 - legacy_venvs is a fixture


def _fs(root, **kw):
    return fsspec.filesystem("zvfs", fo=str(root), skip_instance_cache=True, **kw)


def test_registered_through_the_entry_point():
    from zvfs.fronts.filesystem import ZvfsFileSystem

    assert fsspec.get_filesystem_class("zvfs") is ZvfsFileSystem
    assert "zvfs" in fsspec.available_protocols()


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_every_file_and_listing_as_the_reference(stores, writer):
    E = stores.expected(writer)
    fs = _fs(stores.root(writer))
    for d in sorted(E.dirs()):
        got = [name.rsplit("/", 1)[-1] for name in fs.ls(d, detail=False)]
        assert sorted(got) == E.listing(d), d
    bad = []
    for path, want in E.tree().items():
        got = fs.cat_file(path)
        if isinstance(want, dict) or path.endswith("zarr.json") and path.rsplit("/", 1)[0] in E.arrays \
                and E.arrays[path.rsplit("/", 1)[0]].kind == "unshard":
            ok = json.loads(got) == (want if isinstance(want, dict) else json.loads(want))
        else:
            ok = got == want
        if not ok:
            bad.append(path)
        info = fs.info(path)
        assert info["type"] == "file" and info["size"] == len(got), path
    assert not bad, bad[:10]


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_zarr3_reads_every_array_as_the_original(stores, writer):
    root = stores.root(writer)
    fs = _fs(root, asynchronous=True)
    checked = 0
    for path in stores.expected(writer).arrays:
        try:
            want = zarr.open_array(root, path=path, mode="r")[...]
        except Exception:  # noqa: BLE001 - (arrays zarr-python cannot read even from the original)
            continue
        got = zarr.open_array(zarr.storage.FsspecStore(fs, path=path, read_only=True), mode="r")[...]
        np.testing.assert_array_equal(got, want, err_msg=path)
        checked += 1
    assert checked >= 10


def test_ranges_and_errors(stores):
    root = stores.root("zarr-python")
    E = stores.expected("zarr-python")
    fs = _fs(root)
    path, want = next((p, b) for p, b in E.tree().items() if isinstance(b, bytes) and len(b) > 100)
    assert fs.cat_file(path, 10, 50) == want[10:50]
    assert fs.cat_file(path, -20) == want[-20:]
    assert fs.cat_file(path, 5, -5) == want[5:-5]
    assert fs.cat_file(path, len(want) + 5) == b""
    with fs.open(path) as f:
        f.seek(7)
        assert f.read(33) == want[7:40]
    for missing in ("nope", "../etc/passwd", "a/../../b", "x" * 300):
        with pytest.raises(FileNotFoundError):
            fs.cat_file(missing)
    with pytest.raises(OSError):
        fs.open(path, "wb")
    with pytest.raises(OSError):
        fs.rm(path)
    assert fs.exists(path) and not fs.exists("nope") and fs.isdir("") and not fs.isfile("")


def test_pickled_threaded_and_forked(stores):
    root = stores.root("zarr-python")
    E = stores.expected("zarr-python")
    fs = _fs(root, view="zarr")
    files = [(p, b) for p, b in E.tree().items() if isinstance(b, bytes)]
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.cat_file(files[0][0]) == files[0][1]
    errors: list = []

    def read(k: int) -> None:
        for p, b in files[k::8]:
            if fs.cat_file(p) != b:
                errors.append(p)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    pid = os.fork()
    if pid == 0:  # a forked child reads through the same object (a loop of its own)
        ok = all(fs.cat_file(p) == b for p, b in files[:20])
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_views_through_options(stores):
    """`view=` and other `-o` options as keywords: the Zarr v2 view read by zarr-python 3
    as a Zarr v2 store, equal to the original."""
    root = stores.root("zarr-python")
    fs = _fs(root, view="zarr2", memory="256M")
    checked = 0
    for path, a in stores.expected("zarr-python").arrays.items():
        if a.kind != "unshard" or not fs.exists(f"{path}/.zarray"):
            continue
        want = zarr.open_array(root, path=path, mode="r")[...]
        store = zarr.storage.FsspecStore(_fs(root, view="zarr2", asynchronous=True), path=path, read_only=True)
        got = zarr.open_array(store, mode="r", zarr_format=2)[...]
        np.testing.assert_array_equal(got, want, err_msg=path)
        checked += 1
    assert checked >= 5


READ_ZARR_218 = r'''
import json, logging, sys, fsspec, numpy as np, zarr
assert zarr.__version__.startswith("2.18"), zarr.__version__
job, out = json.loads(sys.argv[1]), sys.argv[2]
warnings = []
logging.getLogger("zvfs").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: warnings.append(r.getMessage())})())
for i, (root, paths) in enumerate(job):
    fs = fsspec.filesystem("zvfs", fo=root, view="zarr2")  # through the entry point
    mapper = fsspec.get_mapper("zvfs::" + root, zvfs={"view": "zarr2"})
    group = zarr.open_group(zarr.storage.FSStore("", fs=fs, mode="r"), mode="r")
    for j, path in enumerate(paths):
        a = group[path]
        assert type(a.store).__name__ == "FSStore", type(a.store)
        np.save(f"{out}/{i}-{j}.npy", a[...])
        np.save(f"{out}/{i}-{j}-mapper.npy", zarr.open_array(mapper, path=path, mode="r")[...])
json.dump({"warnings": warnings}, open(f"{out}/found.json", "w"))
'''


def test_zarr_python_2_18_reads_the_zarr2_view_in_process(stores, legacy_venvs, tmp_path):  # noqa: F811
    """zvfs beside zarr-python 2.18 (no zarr-python 3 there): zarr 2.18's FSStore over the
    filesystem and its mapper over a chained URL read every array of the Zarr v2 view as
    zarr-python 3 reads the originals. An array whose codecs only zarr-python 3 decodes
    (numcodecs.delta) is left out with one line that says so."""
    job = []
    for writer in writers.WRITERS:
        root = stores.root(writer)
        fs = _fs(root, view="zarr2")
        job.append((str(root), [p for p, a in stores.expected(writer).arrays.items()
                                if a.kind == "unshard" and fs.exists(f"{p}/.zarray")]))
    extra = tmp_path / "delta.zarr"
    g = zarr.open_group(extra, mode="w", zarr_format=3)
    g.create_array("plain", shape=(30,), chunks=(8,), shards=(16,), dtype="int32", fill_value=-1)[:20] = np.arange(20)
    g.create_array("delta", shape=(30,), chunks=(8,), dtype="int32", filters=[zarr.codecs.numcodecs.Delta(dtype="<i4")])[:] = 5
    job.append((str(extra), ["plain"]))
    out = tmp_path / "out"
    out.mkdir()
    run_in(legacy_venvs / "ome04", READ_ZARR_218, json.dumps(job), out)
    checked = 0
    for i, (root, paths) in enumerate(job):
        for j, path in enumerate(paths):
            want = zarr.open_array(root, path=path, mode="r")[...]
            for suffix in ("", "-mapper"):
                np.testing.assert_array_equal(np.load(out / f"{i}-{j}{suffix}.npy"), want, err_msg=f"{root} {path}")
            checked += 1
    assert checked >= 40
    warnings = [w for w in json.loads((out / "found.json").read_text())["warnings"] if "zarr-python 3" in w]
    assert len(warnings) == 1 and warnings[0].startswith(
        "zarr2 view: array delta is not shown: codecs ['numcodecs.delta', 'bytes', 'zstd'] of data type 'int32' need "
        "zarr-python 3 (zarr-python 2.18."), warnings


def test_xarray_open_zarr(tmp_path):
    xr = pytest.importorskip("xarray")
    import pandas as pd

    times = pd.date_range("2026-01-01", periods=24, freq="h")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), np.random.default_rng(0).normal(280, 5, (24, 32, 48)).astype("float32"),
                 {"units": "K", "long_name": "2 metre temperature"})},
        coords={"time": times, "lat": np.linspace(-80, 80, 32), "lon": np.linspace(0, 355, 48)})
    ds.to_zarr(tmp_path / "weather.zarr", zarr_format=3, consolidated=False,
               encoding={"t2m": {"chunks": (6, 16, 16), "shards": (12, 32, 48)}})
    got = xr.open_zarr("zvfs::" + str(tmp_path / "weather.zarr"), consolidated=False)
    want = xr.open_zarr(tmp_path / "weather.zarr", consolidated=False)
    xr.testing.assert_identical(got.load(), want.load())


def test_dask_on_a_local_cluster_of_two_processes(stores):
    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    root = stores.root("zarr-python")
    paths = [p for p, a in stores.expected("zarr-python").arrays.items() if a.kind == "unshard"
             and len(a.meta["shape"]) >= 2 and np.prod(a.meta["shape"]) >= 1000][:4]
    assert paths
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        for path in paths:
            want = zarr.open_array(root, path=path, mode="r")[...]
            got = da.from_zarr(f"zvfs::{root}", component=path).compute()
            np.testing.assert_array_equal(got, want, err_msg=path)
        workers = client.run(lambda: os.getpid())
        assert len(set(workers.values())) == 2


def test_chained_over_http_and_s3(stores, tmp_path):
    root = stores.root("zarr-python")
    E = stores.expected("zarr-python")
    files = [(p, b) for p, b in E.tree().items() if isinstance(b, bytes)][:40]
    web = tmp_path / "www"
    shutil.copytree(root, web / "store.zarr")
    nginx = Nginx(web, tmp_path / "nginx").start()
    try:
        fs, _ = fsspec.core.url_to_fs(f"zvfs::{nginx.url}/store.zarr")
        assert all(fs.cat_file(p) == b for p, b in files)
    finally:
        nginx.stop()
    s3 = S3().start()
    try:
        url = s3.upload(root, "bucket", "store.zarr")
        fs, _ = fsspec.core.url_to_fs(f"zvfs::{url}", s3={"endpoint_url": s3.endpoint})
        assert all(fs.cat_file(p) == b for p, b in files)
        listing = sorted(n.rsplit("/", 1)[-1] for n in fs.ls("", detail=False))
        assert listing == E.listing("")
    finally:
        s3.stop()


def test_an_open_file_is_a_snapshot(public_tmp):
    """A file opened through the front reads only the version it opened while its shard is
    replaced (rename): its old bytes or an error (docs/reliability.md, point 1: a replaced
    shard's old handles get EIO), never the new bytes; a new open reads the new version."""
    root = public_tmp / "s.zarr"
    a = zarr.create_array(root, shape=(256, 256), chunks=(128, 128), shards=(256, 256), dtype="uint8", compressors=None)
    old = np.random.default_rng(1).integers(0, 255, (256, 256), dtype=np.uint8)
    new = np.random.default_rng(2).integers(0, 255, (256, 256), dtype=np.uint8)
    a[:] = old
    twin = public_tmp / "t.zarr"
    b = zarr.create_array(twin, shape=(256, 256), chunks=(128, 128), shards=(256, 256), dtype="uint8", compressors=None)
    b[:] = new
    fs = _fs(root)
    with fs.open("c/0/0", block_size=1024, cache_type="none") as f:
        first = f.read(1000)
        shutil.copy(twin / "c" / "0" / "0", root / "c" / "0" / "0.tmp")
        os.replace(root / "c" / "0" / "0.tmp", root / "c" / "0" / "0")
        try:
            rest = f.read()
        except OSError as e:
            assert "changed" in str(e), e
            rest = None
    assert first == old[:128, :128].tobytes()[:1000]
    if rest is not None:
        assert first + rest == old[:128, :128].tobytes()
    assert fs.cat_file("c/0/0") == new[:128, :128].tobytes()


FEW_DESCRIPTORS = r'''
import os, resource, sys, fsspec, numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
roots, most, bad = sys.argv[1:], 0, 0
for round in range(2):
    for root in roots:
        fs = fsspec.filesystem("zvfs", fo=root)
        want = np.load(root + ".npy")
        for i in range(8):
            for j in range(8):
                got = np.frombuffer(fs.cat_file(f"c/{i}/{j}"), np.uint8).reshape(16, 16)
                bad += not np.array_equal(got, want[16 * i:16 * i + 16, 16 * j:16 * j + 16])
                most = max(most, len(os.listdir("/proc/self/fd")))
print(most, bad)
'''


def test_stores_of_one_process_share_its_descriptors(public_tmp):
    """A program reading several stores in-process keeps within its file limit: with a soft
    RLIMIT_NOFILE of 256 (desktops have 1024), six stores of 64 shards each, every chunk read
    twice, all right, and the process never holds more than 256 descriptors (before: 263 per
    store once its shards were read, and EMFILE at the fourth)."""
    import subprocess
    import sys

    roots = []
    for k in range(6):
        root = public_tmp / f"s{k}.zarr"
        data = np.random.default_rng(k).integers(0, 255, (128, 128), dtype=np.uint8)
        a = zarr.create_array(root, shape=data.shape, chunks=(16, 16), shards=(16, 16), dtype="uint8", compressors=None)
        a[:] = data
        np.save(f"{root}.npy", data)
        roots.append(str(root))
    out = subprocess.run([sys.executable, "-c", FEW_DESCRIPTORS, *roots], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    most, bad = map(int, out.stdout.split())
    assert bad == 0 and most < 200, (most, bad)
