"""`zvfs serve` read by the clients people point at an HTTP store, each over real sockets:
zarr-python 3 (fsspec's HTTP store) on the zarr view; zarr-python 2.18 and ome-zarr-py 0.9 on
the zarr2 view (in the venv `scripts/setup-legacy` makes); tensorstore's http kvstore under its
zarr3, zarr and n5 drivers; cloud-volume (`precomputed://http://...`) on the precomputed view;
zarrita.js in node; and a web page in headless Chromium that reads an array with zarrita.js
from another origin (CORS) and draws it, checked pixel by pixel on a screenshot.

Stores are written by independent writers (zarr-python 3 and tensorstore with sharding,
ome-zarr-py >= 0.11, tensorstore's neuroglancer_precomputed driver) and every answer is compared
with the originals read from disk by zarr-python 3 (or with the data the writer was given), never
with what zvfs says. Each test also checks that the view is unsharded where a client could read
the sharded original too (zarr-python 3, tensorstore, cloud-volume), so a server that passed the
store through unchanged fails. The JavaScript clients come from tests/js (`npm ci` in
scripts/setup); Chromium is the system's (Debian package), driven by playwright-core.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zarr

import test_legacy_tools
import writers_precomputed as wp
from servers import ZvfsServe, free_port, serve_in_thread, stop_server
from test_legacy_tools import READ_OME_04, original_levels, run_in

legacy_venvs = test_legacy_tools.legacy_venvs  # the session fixture: scripts/setup-legacy's venvs

JS = Path(__file__).resolve().parent / "js"

#: zarr-python 3 and tensorstore write sharded arrays: (path, inner chunk shape)
ARRAYS = {"vol": (4, 16, 16), "f32": (10, 10), "ts/i32": (8, 8)}


@pytest.fixture(scope="module")
def public_dir():
    """A directory everyone may read (pytest's own are 0700, and serve shows only what is public)."""
    base = Path(tempfile.mkdtemp(prefix="zvfs-clients-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def zarr_store(public_dir) -> tuple[Path, dict[str, np.ndarray]]:
    """A Zarr v3 hierarchy of sharded arrays, and each array as zarr-python 3 reads the original."""
    import tensorstore as ts

    root = public_dir / "store.zarr"
    rng = np.random.default_rng(24)
    g = zarr.open_group(root, mode="w", zarr_format=3)
    # uint16 over every bit (the page draws low and high bytes), partial shards at the edges
    vol = g.create_array("vol", shape=(6, 37, 45), chunks=ARRAYS["vol"], shards=(4, 32, 32), dtype="uint16",
                         compressors=zarr.codecs.GzipCodec(level=5), fill_value=0)
    vol[:] = rng.integers(0, 65536, vol.shape, dtype=np.uint16)
    # zstd; a fill value that is not 0 and shards never written (readers fill them)
    f32 = g.create_array("f32", shape=(50, 60), chunks=ARRAYS["f32"], shards=(20, 30), dtype="float32",
                         compressors=zarr.codecs.ZstdCodec(), fill_value=-1.5)
    f32[:20, :30] = rng.random((20, 30), dtype=np.float32)
    f32[40:, 30:45] = rng.random((10, 15), dtype=np.float32)
    g.create_group("ts")
    # tensorstore: blosc inside the shards, a crc32c index
    inner = [{"name": "bytes", "configuration": {"endian": "little"}},
             {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4}}]
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "ts" / "i32")}, "create": True,
                 "metadata": {"shape": [30, 41], "data_type": "int32", "fill_value": 7,
                              "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 24]}},
                              "codecs": [{"name": "sharding_indexed", "configuration": {
                                  "chunk_shape": list(ARRAYS["ts/i32"]), "codecs": inner,
                                  "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                                   {"name": "crc32c"}]}}]}}).result()
    t[...] = rng.integers(-2**31, 2**31, (30, 41), dtype=np.int32)
    want = {p: np.asarray(zarr.open_array(root / p, mode="r")[...]) for p in ARRAYS}
    return root, want


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """serve(SOURCE, *ARGS) -> the URL of `zvfs serve SOURCE ARGS`, one server per arguments."""
    made: dict[tuple, ZvfsServe] = {}
    logs = tmp_path_factory.mktemp("serve-logs")
    with contextlib.ExitStack() as stack:
        def get(source: Path, *args: str) -> str:
            key = (str(source), *args)
            if key not in made:
                made[key] = stack.enter_context(ZvfsServe(source, *args, log=logs / f"serve-{len(made)}.log"))
            return made[key].url
        yield get


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    assert np.array_equal(got, want), f"{what}: {int((got != want).sum())} values differ"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def assert_unsharded(url: str, path: str, view: str) -> None:
    """The array's metadata is of `view`'s format only, without sharding (zarrita.js reads
    sharded Zarr v3 and falls back from one format to the other: a store passed through as it
    is would read the same)."""
    try:
        v3 = get_json(f"{url}/{path}/zarr.json")
    except urllib.error.HTTPError as e:
        assert view == "zarr2" and e.code == 404, f"{path}/zarr.json: {e}"
        assert get_json(f"{url}/{path}/.zarray")["zarr_format"] == 2
        return
    assert view == "zarr", f"{path}: zarr.json in the {view} view"
    assert "sharding_indexed" not in json.dumps(v3["codecs"]), f"{path}: the view is not unsharded"


# -- Python clients


def test_zarr_python_3_reads_the_zarr_view_over_http(zarr_store, serve):
    root, want = zarr_store
    url = serve(root, "--view", "zarr")
    assert zarr.open_group(url, mode="r").metadata.zarr_format == 3
    for path, chunks in ARRAYS.items():
        a = zarr.open_array(f"{url}/{path}", mode="r")
        assert a.shards is None and a.chunks == chunks, f"{path}: the view is not unsharded"
        assert_same(np.asarray(a[...]), want[path], f"zarr-python 3 {path}")
        assert_same(np.asarray(a[1:4, 3:]), want[path][1:4, 3:], f"zarr-python 3 {path}[1:4, 3:]")


def test_zarr_python_3_lists_a_group_over_http(zarr_store, serve):
    root, _ = zarr_store
    group = zarr.open_group(serve(root, "--view", "zarr"), mode="r")
    assert sorted(name for name, _ in group.members()) == ["f32", "ts", "vol"]


READ_ZARR_218 = r'''
import sys, numpy as np, zarr
assert zarr.__version__.startswith("2.18"), zarr.__version__
url, out = sys.argv[1], sys.argv[2]
for i, path in enumerate(sys.argv[3:]):
    a = zarr.open_array(f"{url}/{path}", mode="r")  # fsspec's HTTP store
    assert a.store.__class__.__name__ == "FSStore", type(a.store)
    np.save(f"{out}/{i}.npy", a[...])
'''


def test_zarr_python_2_18_reads_the_zarr2_view_over_http(zarr_store, serve, legacy_venvs, tmp_path):
    root, want = zarr_store
    url = serve(root, "--view", "zarr2")
    run_in(legacy_venvs / "ome04", READ_ZARR_218, url, tmp_path, *ARRAYS)
    for i, path in enumerate(ARRAYS):
        assert_same(np.load(tmp_path / f"{i}.npy"), want[path], f"zarr 2.18 {path}")


WRITE_OME = r'''
import sys, numpy as np, zarr
from ome_zarr.writer import write_image, write_labels
from ome_zarr.format import FormatV05
rng = np.random.default_rng(9)
data = rng.integers(0, 60000, size=(2, 6, 48, 40), dtype=np.uint16)
root = zarr.open_group(sys.argv[1], mode="w", zarr_format=3)
write_image(data, root, axes="czyx", fmt=FormatV05(), scale_factors=(2,),
            storage_options={"chunks": (1, 3, 16, 16), "shards": (1, 6, 32, 32)})
write_labels((data[0] > 30000).astype(np.uint8), root, name="cells", axes="zyx", fmt=FormatV05(), scale_factors=(2,),
             storage_options={"chunks": (3, 16, 16), "shards": (6, 32, 32)})
'''


@pytest.fixture(scope="module")
def ome_image(public_dir, legacy_venvs) -> Path:
    src = public_dir / "image.ome.zarr"
    run_in(legacy_venvs / "ome05", WRITE_OME, src)
    return src


def test_ome_zarr_py_0_9_reads_the_image_over_http(ome_image, serve, legacy_venvs, tmp_path):
    src = ome_image
    url = serve(src, "--view", "zarr2")
    run_in(legacy_venvs / "ome04", READ_OME_04, url, tmp_path)
    found = {e["path"]: e for e in json.loads((tmp_path / "found.json").read_text())}
    image = found["."]
    assert "Multiscales" in image["specs"] and image["multiscales"][0]["version"] == "0.4"
    want = original_levels(src)
    assert len(want) == 2 and len(image["reader"]) == len(image["zarr2"]) == 2
    for i, w in enumerate(want):
        for f in (image["reader"][i], image["zarr2"][i]):  # ome-zarr-py's dask arrays; zarr 2.18 by path
            assert_same(np.load(f), w, f"ome-zarr-py level {i} ({Path(f).name})")
    assert found["labels"]["labels"] == ["cells"]
    for i, (f, w) in enumerate(zip(found["labels/cells"]["reader"], original_levels(src / "labels" / "cells"), strict=True)):
        assert_same(np.load(f), w, f"ome-zarr-py label level {i}")


@pytest.mark.parametrize("driver,view", [("zarr3", "zarr"), ("zarr", "zarr2"), ("n5", "n5")])
def test_tensorstore_reads_over_its_http_kvstore(zarr_store, serve, driver, view):
    import tensorstore as ts

    root, want = zarr_store
    url = serve(root, "--view", view)
    for path, chunks in ARRAYS.items():
        t = ts.open({"driver": driver, "kvstore": {"driver": "http", "base_url": url, "path": f"{path}/"},
                     "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()
        got = np.asarray(t.read().result())
        # (the write chunk: a shard if the view were sharded; N5 lists dimensions fastest-varying first)
        shape = tuple(t.chunk_layout.write_chunk.shape)
        if view == "n5":
            got, shape = got.T, shape[::-1]
        assert shape == chunks, f"{driver} {path}: read chunks {shape}, not the unsharded {chunks}"
        assert_same(got, want[path], f"tensorstore {driver} {path}")


@pytest.fixture(scope="module")
def precomputed(public_dir) -> list[tuple[Path, wp.TsDataset]]:
    """tensorstore's sharded precomputed datasets (an image; a segmentation, partly
    compressed_segmentation, with one unsharded scale), and the data each scale was given."""
    return [(wp.write_ts_dataset(public_dir / ds.name, ds), ds) for ds in wp.ts_datasets()]


def test_cloud_volume_reads_the_precomputed_view_over_http(precomputed, serve, tmp_path):
    from cloudvolume import CloudVolume

    for src, ds in precomputed:
        url = serve(src)
        info = get_json(f"{url}/info")
        assert not any("sharding" in s for s in info["scales"]), f"{ds.name}: the view is not unsharded"
        with wp.cloudvolume_env(tmp_path / ds.name):
            for mip, data in enumerate(ds.data):
                vol = CloudVolume(f"precomputed://{url}", mip=mip, fill_missing=True, progress=False, cache=False,
                                  parallel=1)
                got = np.asarray(vol[vol.bounds])  # (x, y, z, channel), from voxel_offset
                assert_same(got, data, f"cloud-volume {ds.name} mip {mip} ({ds.scales[mip].encoding})")


# -- JavaScript clients: zarrita.js in node and in Chromium


@pytest.fixture(scope="session")
def node_modules() -> Path:
    if shutil.which("node") is None or not (JS / "node_modules" / "zarrita").is_dir():
        pytest.fail("the JavaScript clients are not installed: run scripts/setup (node, npm ci in tests/js)")
    return JS / "node_modules"


@pytest.mark.parametrize("view", ["zarr", "zarr2"])
def test_zarrita_js_in_node_reads_over_http(zarr_store, serve, node_modules, view, tmp_path):
    root, want = zarr_store
    url = serve(root, "--view", view)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"root": f"{url}/", "arrays": list(ARRAYS), "out": str(tmp_path)}))
    r = subprocess.run(["node", str(JS / "read_arrays.mjs"), str(job)], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "result.json").read_text())
    for i, (path, result) in enumerate(zip(ARRAYS, results, strict=True)):
        assert_unsharded(url, path, view)
        assert "error" not in result, f"zarrita {view} {path}: {result.get('error')}"
        got = np.frombuffer((tmp_path / f"{i}.bin").read_bytes(), dtype=np.dtype(result["dtype"]))
        assert_same(got.reshape(result["shape"]), want[path], f"zarrita.js {view} {path}")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def page_origin():
    """A static server of tests/js on loopback: the page's origin, not the zvfs server's."""
    port = free_port()
    static = serve_in_thread(port, functools.partial(_Quiet, directory=str(JS)))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(static)


def screenshot(page: str, width: int, height: int, out: Path) -> tuple[dict, np.ndarray]:
    """Chromium opens `page` (tests/js/screenshot.mjs): its shot.json and pixels (RGBA rows)."""
    chromium = shutil.which("chromium")
    assert chromium, "no chromium on PATH: run scripts/setup (Debian's chromium package)"
    r = subprocess.run(["node", str(JS / "screenshot.mjs"), chromium, page, str(width), str(height), str(out)],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    shot = json.loads((out / "shot.json").read_text())
    return shot, np.fromfile(out / "shot.rgba", dtype=np.uint8).reshape(shot["height"], shot["width"], 4)


def test_chromium_page_draws_the_array_read_with_zarrita(zarr_store, serve, node_modules, page_origin, tmp_path):
    """tests/js/page.html, from another origin (the zvfs server lets it read with --cors), draws
    every value of `vol` as one pixel (v & 255, v >> 8, 77), its z planes side by side; the
    screenshot's pixels must be those of the original, the rest of the viewport the page's
    magenta background."""
    root, want = zarr_store
    vol = want["vol"]
    nz, ny, nx = vol.shape
    url = serve(root, "--view", "zarr", "--cors", page_origin)
    shot, img = screenshot(f"{page_origin}/page.html?src={url}/&array=vol&scale=1", nz * nx + 20, ny + 10, tmp_path)
    assert shot["title"] == "drawn", shot
    assert_unsharded(url, "vol", "zarr")
    drawn = img[:ny, :nz * nx].reshape(ny, nz, nx, 4).transpose(1, 0, 2, 3)
    expect = np.stack([vol & 255, vol >> 8, np.full_like(vol, 77), np.full_like(vol, 255)], axis=-1).astype(np.uint8)
    bad = (drawn != expect).any(axis=-1)
    assert not bad.any(), f"{int(bad.sum())} of {bad.size} pixels differ, first at (z, y, x) {np.argwhere(bad)[0]}"
    magenta = np.array([255, 0, 255, 255], dtype=np.uint8)
    assert (img[ny:] == magenta).all() and (img[:, nz * nx:] == magenta).all(), "drawn outside the array"


def test_chromium_page_of_another_origin_cannot_read_without_cors(zarr_store, serve, node_modules, page_origin,
                                                                   tmp_path):
    """The same page, from an origin the server was not told about: the browser refuses the
    answers (no Access-Control-Allow-Origin for it), the page says so and draws nothing."""
    root, _ = zarr_store
    url = serve(root, "--view", "zarr", "--cors", "http://elsewhere.example")
    shot, img = screenshot(f"{page_origin}/page.html?src={url}/&array=vol&scale=1", 200, 50, tmp_path)
    assert shot["title"].startswith("error:"), shot
    assert any("CORS" in m for m in shot["console"]), shot["console"]
