"""Remote sources through real servers on loopback: HTTP (nginx) and S3 (moto server).

- The same fixture stores mounted from HTTP and from S3 show exactly the tree and bytes of the
  local mount (which the conformance tests check against zarr-python and tensorstore), and the
  readers read the remote mounts like the originals.
- Request economy, counted in nginx's access log: one request per chunk once its shard index
  is cached, two for the first chunk of a Zarr shard, at most three for a precomputed shard,
  none for an absent chunk, each index once for a listing; `cp -r` coalesces neighbouring
  chunks (at most one request per 8 chunks of 64 KiB, at most 1.1x the bytes).
- Memory: the daemon's peak RSS stays under the `memory` budget while a store ten times that
  size is read through the mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import writers
from conftest import WRITER_ARRAYS, writer_array_id, zvfs_mount
from servers import S3, Nginx
from test_zarr_conformance import NOT_READABLE, READ, READERS, assert_same_array

pytestmark = pytest.mark.mount


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path below root: files with their bytes, directories as None."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            data = Path(p).read_bytes()
            assert len(data) == os.stat(p).st_size, f"{p}: st_size differs from the bytes read"
            out[os.path.normpath(os.path.join(rel, f))] = data
    return out


@pytest.fixture(scope="session")
def srv(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("srv")


@pytest.fixture(scope="session")
def nginx(srv, tmp_path_factory):
    server = Nginx(srv, tmp_path_factory.mktemp("nginx")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3():
    server = S3().start()
    yield server
    server.stop()


def serve(srv: Path, name: str, directory: Path) -> str:
    link = srv / name
    if not link.exists():
        link.symlink_to(directory)
    return name


@pytest.fixture(scope="session")
def remote_mounts(stores, nginx, s3, srv, tmp_path_factory):
    """(kind, writer) -> mount point of that writer's fixture store from HTTP or S3."""
    import contextlib

    stack = contextlib.ExitStack()
    made: dict[tuple[str, str], Path] = {}

    def get(kind: str, writer: str) -> Path:
        if (kind, writer) not in made:
            root = stores.root(writer)
            if kind == "http":
                url = f"{nginx.url}/{serve(srv, writer, root)}"
                options = ()
            else:
                url = s3.upload(root, "fixtures", writer)
                options = (f"endpoint={s3.endpoint}",)
            base = tmp_path_factory.mktemp(f"mnt-{kind}-{writer}")
            made[(kind, writer)] = stack.enter_context(zvfs_mount(url, base / "mnt", log=base / "zvfs.log", options=options))
        return made[(kind, writer)]

    with stack:
        yield get


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("writer", writers.WRITERS)
def test_remote_mount_shows_the_local_tree(stores, remote_mounts, kind, writer):
    local = tree(stores.mount(writer))
    remote = tree(remote_mounts(kind, writer))
    assert sorted(remote) == sorted(local)
    differ = [p for p in local if remote[p] != local[p]]
    assert not differ, f"{len(differ)} files differ, e.g. {differ[:5]}"


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_readers_read_remote_mounts_like_the_original(stores, remote_mounts, kind, wa, reader):
    writer, path = wa
    if (reader, path) in NOT_READABLE:
        with pytest.raises(Exception):
            READ[reader](remote_mounts(kind, writer) / path)
        return
    want = READ[reader](stores.infos(writer)[path].directory)
    assert_same_array(READ[reader](remote_mounts(kind, writer) / path), want, f"{reader} via {kind}")


# --------------------------------------------------------------------------- request economy


def write_zarr(path: Path, shape, chunks, shards, seed=0) -> np.ndarray:
    import zarr

    data = np.random.default_rng(seed).integers(1, 255, size=shape, dtype="uint8")
    a = zarr.create_array(path, shape=shape, chunks=chunks, shards=shards, dtype="uint8", compressors=None, fill_value=0)
    a[...] = data
    return data


@pytest.fixture(scope="module")
def economy(srv, nginx, tmp_path_factory):
    """A 2x2-shard array of 8x8 chunks of 4 KiB (chunk (0, 0) empty), mounted over HTTP."""
    d = tmp_path_factory.mktemp("economy")
    data = write_zarr(d / "a.zarr", (512, 512), (64, 64), (256, 256))
    import zarr

    zarr.open_array(d / "a.zarr", mode="r+")[0:64, 0:64] = 0
    url = f"{nginx.url}/{serve(srv, 'economy', d)}/a.zarr"
    base = tmp_path_factory.mktemp("mnt-economy")
    # no read-ahead here: these tests count single-chunk requests (coalescing is tested below)
    with zvfs_mount(url, base / "mnt", log=base / "zvfs.log", options=("readahead=0",)) as mnt:
        yield mnt, nginx, data


def test_first_chunk_of_a_shard_costs_index_and_data_then_one_request_per_chunk(economy):
    mnt, ng, data = economy
    mark = ng.mark()
    assert (mnt / "c/1/1").read_bytes() == data[64:128, 64:128].tobytes()
    reqs = ng.requests(mark)
    assert [r.range.startswith("bytes=-") for r in reqs] == [True, False], reqs  # index (suffix), then data
    assert all(r.path == "/economy/a.zarr/c/0/0" for r in reqs)
    for coords in ((1, 2), (3, 3), (2, 0)):  # same shard (0, 0): its index is cached
        mark = ng.mark()
        got = (mnt / "c" / str(coords[0]) / str(coords[1])).read_bytes()
        assert got == data[coords[0] * 64:(coords[0] + 1) * 64, coords[1] * 64:(coords[1] + 1) * 64].tobytes()
        assert len(ng.requests(mark)) == 1


def test_absent_chunk_with_cached_index_costs_nothing(economy):
    mnt, ng, _ = economy
    (mnt / "c/2/2").stat()  # the index of shard (0, 0) is cached now
    mark = ng.mark()
    with pytest.raises(FileNotFoundError):
        (mnt / "c/0/0").stat()
    assert ng.requests(mark) == []


def test_listing_reads_each_index_once(economy):
    mnt, ng, _ = economy
    mark = ng.mark()
    names = sorted(os.listdir(mnt / "c" / "5"))  # row 5: shards (1, 0) and (1, 1), not read yet
    assert names == sorted(str(i) for i in range(8))
    reqs = ng.requests(mark)
    assert sorted(r.path for r in reqs) == ["/economy/a.zarr/c/1/0", "/economy/a.zarr/c/1/1"]
    assert all(r.range.startswith("bytes=-") for r in reqs)
    mark = ng.mark()
    assert sorted(os.listdir(mnt / "c" / "6")) == names  # same shards: no request
    assert ng.requests(mark) == []


def test_precomputed_first_chunk_costs_at_most_three_requests(srv, nginx, tmp_path_factory):
    import tensorstore as ts

    d = tmp_path_factory.mktemp("pc-economy")
    sharding = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0, "hash": "identity",
                "minishard_bits": 1, "shard_bits": 1, "minishard_index_encoding": "gzip", "data_encoding": "raw"}
    t = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(d / "ds")},
                 "scale_metadata": {"size": [64, 64, 16], "chunk_size": [16, 16, 16], "resolution": [1, 1, 1],
                                    "encoding": "raw", "sharding": sharding},
                 "multiscale_metadata": {"data_type": "uint8", "num_channels": 1, "type": "image"}, "create": True}).result()
    data = np.random.default_rng(1).integers(1, 255, size=(64, 64, 16, 1), dtype="uint8")
    t[...] = data
    url = f"{nginx.url}/{serve(srv, 'pc-economy', d)}/ds"
    base = tmp_path_factory.mktemp("mnt-pc-economy")
    with zvfs_mount(url, base / "mnt", log=base / "zvfs.log") as mnt:
        key = json.loads((d / "ds" / "info").read_text())["scales"][0]["key"]
        mark = nginx.mark()
        got = (mnt / key / "16-32_0-16_0-16").read_bytes()
        assert got == np.ascontiguousarray(data[16:32, 0:16, 0:16, :].transpose(3, 2, 1, 0)).tobytes()
        assert len(nginx.requests(mark)) <= 3


def test_cp_r_coalesces_neighbouring_chunks(srv, nginx, tmp_path_factory):
    """256 chunks of 64 KiB in 4 shards: at most one request per 8 chunks, <= 1.1x the bytes."""
    d = tmp_path_factory.mktemp("coalesce")
    write_zarr(d / "a.zarr", (4096, 4096), (256, 256), (2048, 2048), seed=2)
    url = f"{nginx.url}/{serve(srv, 'coalesce', d)}/a.zarr"
    base = tmp_path_factory.mktemp("mnt-coalesce")
    with zvfs_mount(url, base / "mnt", log=base / "zvfs.log") as mnt:
        mark = nginx.mark()
        subprocess.run(["cp", "-r", str(mnt), str(base / "copy")], check=True, timeout=300)
        reqs = nginx.requests(mark)
    chunks = [p for p in (base / "copy" / "c").rglob("*") if p.is_file()]
    copied = sum(p.stat().st_size for p in chunks)
    assert len(chunks) == 256 and copied == 256 * 65536
    assert len(reqs) <= len(chunks) // 8, f"{len(reqs)} requests for {len(chunks)} chunks"
    assert sum(r.nbytes for r in reqs) <= 1.1 * copied
    import zarr

    assert np.array_equal(zarr.open_array(base / "copy", mode="r")[...], zarr.open_array(d / "a.zarr", mode="r")[...])


# --------------------------------------------------------------------------- memory


def test_rss_stays_under_the_memory_budget_while_reading_ten_times_that(srv, nginx, tmp_path_factory):
    budget = 160 << 20
    d = tmp_path_factory.mktemp("memory")
    write_zarr(d / "one.zarr", (4096, 4096, 10), (256, 256, 10), (1024, 1024, 10), seed=3)  # 160 MiB
    root = d / "big.zarr"
    import zarr

    zarr.open_group(root, mode="w", zarr_format=3)
    for i in range(11):  # 11 arrays sharing the same shard files (hard links): 1.7 GiB to read
        shutil.copytree(d / "one.zarr", root / f"a{i}", copy_function=os.link)
    url = f"{nginx.url}/{serve(srv, 'memory', d)}/big.zarr"
    base = tmp_path_factory.mktemp("mnt-memory")
    with zvfs_mount(url, base / "mnt", log=base / "zvfs.log", options=(f"memory={budget}",)) as mnt:
        pid = int(subprocess.run(["pgrep", "-f", f"zvfs mount {url} "], capture_output=True, text=True).stdout.split()[0])
        t = time.monotonic()
        read = 0
        for dirpath, _, files in os.walk(mnt):
            for f in files:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        read += len(chunk)
        status = Path(f"/proc/{pid}/status").read_text()
    peak = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) * 1024
    assert read >= 10 * budget, read
    assert peak < budget, f"peak RSS {peak >> 20} MiB over a {budget >> 20} MiB budget ({read >> 20} MiB read in {time.monotonic() - t:.1f} s)"


# --------------------------------------------------------------------------- precomputed


@pytest.fixture(scope="module")
def precomputed_sets(tmp_path_factory, no_mounts_left_behind):
    """Precomputed datasets from the precomputed tests' writers (tensorstore, cloud-volume,
    and the spec-built annotations), with their local mounts."""
    import contextlib

    import writers_precomputed as wp
    from test_precomputed_mount import TS, Precomputed

    with wp.cloudvolume_env(tmp_path_factory.mktemp("cv-env-remote")), contextlib.ExitStack() as stack:
        pc = Precomputed(tmp_path_factory.mktemp("precomputed-remote"), stack)
        sets = {name: pc.ts(name) for name in sorted(TS)}
        sets["cv"] = pc.cv().root
        sets["annotations"] = pc.annotations()[0]
        yield {name: (root, pc.mount(name, root)) for name, root in sets.items()}


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_remote_precomputed_mounts_show_the_local_trees(precomputed_sets, nginx, s3, srv, kind, tmp_path_factory):
    for name, (root, local_mnt) in precomputed_sets.items():
        if kind == "http":
            url, options = f"{nginx.url}/{serve(srv, 'pc-' + name, root)}", ()
        else:
            url, options = s3.upload(root, "precomputed", name), (f"endpoint={s3.endpoint}",)
        base = tmp_path_factory.mktemp(f"mnt-{kind}-{name}")
        with zvfs_mount(url, base / "mnt", log=base / "zvfs.log", options=options) as mnt:
            local, remote = tree(local_mnt), tree(mnt)
        assert sorted(remote) == sorted(local), name
        differ = [p for p in local if remote[p] != local[p]]
        assert not differ, f"{name}: {len(differ)} files differ, e.g. {differ[:5]}"


# --------------------------------------------------------------------------- ZVF


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_remote_zvf_mounts_show_the_local_trees(nginx, s3, srv, kind, tmp_path_factory):
    """ZVF stores of several geometries (and a mixed sharded/unsharded pyramid), with their
    objects/ directories, read the same from HTTP and S3 as from the local disk."""
    import writers_zvf

    for name in ("polylines", "points_oids", "mesh", "pyramid"):
        parent = tmp_path_factory.mktemp(f"zvf-{kind}-{name}")
        root, _ = writers_zvf.write_case(name, parent, sharded=True)
        if kind == "http":
            url, options = f"{nginx.url}/{serve(srv, f'zvf-{name}', parent)}/{root.name}", ()
        else:
            url, options = s3.upload(root, "zvf", name), (f"endpoint={s3.endpoint}",)
        base = tmp_path_factory.mktemp(f"mnt-{kind}-{name}")
        with zvfs_mount(root, base / "local", log=base / "local.log") as local_mnt:
            local = tree(local_mnt)
        with zvfs_mount(url, base / "mnt", log=base / "zvfs.log", options=options) as mnt:
            remote = tree(mnt)
        assert any("/objects/" in p for p in local), name
        assert sorted(remote) == sorted(local), name
        differ = [p for p in local if remote[p] != local[p]]
        assert not differ, f"{name}: {len(differ)} files differ, e.g. {differ[:5]}"
