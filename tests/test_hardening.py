"""Hardening: bad metadata at mount time, backend faults at read time, load, credentials.

- Bad metadata: one line naming the file and the problem, exit status 2, no traceback,
  nothing mounted; `zvfs ls` and `zvfs inspect` report the same way.
- Backend faults (a proxy injecting 503s, resets, stalls and cut bodies at a fixed rate):
  every read returns the right bytes or EIO, the mount stays up, and it serves every file
  again once the backend recovers.
- Load: 64 concurrent readers for a bounded time, local and over HTTP: no errors, every byte
  compared, RSS flat.
- Credentials in a source URL never show in /proc/mounts, process titles, logs or inspect.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import is_mounted, run_zvfs, zvfs_mount
from servers import FaultProxy, Nginx

pytestmark = pytest.mark.mount


# --------------------------------------------------------------------------- bad metadata


def _array_meta(**edit) -> dict:
    meta = {"zarr_format": 3, "node_type": "array", "shape": [16, 16], "data_type": "uint8", "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4], "codecs": [{"name": "bytes"}]}}]}
    meta.update(edit)
    return meta


def _info(**scale_edit) -> dict:
    scale = {"key": "s0", "size": [64, 64, 8], "voxel_offset": [0, 0, 0], "chunk_sizes": [[16, 16, 8]],
             "resolution": [1, 1, 1], "encoding": "raw",
             "sharding": {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0, "hash": "identity",
                          "minishard_bits": 1, "shard_bits": 1}}
    scale.update(scale_edit)
    return {"@type": "neuroglancer_multiscale_volume", "type": "image", "data_type": "uint8", "num_channels": 1, "scales": [scale]}


BAD = {
    # name: (files to write, the file the message must name, words it must contain)
    "zarr malformed JSON": ({"zarr.json": "{"}, "zarr.json", "malformed JSON"),
    "zarr not an object": ({"zarr.json": "[1, 2]"}, "zarr.json", "not a JSON object"),
    "zarr unknown chunk grid": ({"zarr.json": _array_meta(chunk_grid={"name": "rectilinear", "configuration": {}})}, "zarr.json", "chunk_grid"),
    "zarr inconsistent ranks": ({"zarr.json": _array_meta(shape=[16])}, "zarr.json", "rank"),
    "zarr negative shape": ({"zarr.json": _array_meta(shape=[-16, 16])}, "zarr.json", "out-of-range"),
    "zarr absurd grid": ({"zarr.json": _array_meta(shape=[2**40, 2**40])}, "zarr.json", "absurd"),
    "zarr malformed codec": ({"zarr.json": _array_meta(codecs=[5])}, "zarr.json", "codec"),
    "zarr bad index location": ({"zarr.json": _array_meta(codecs=[{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [4, 4], "codecs": [{"name": "bytes"}], "index_location": "middle"}}])}, "zarr.json", "index_location"),
    "zarr bad child metadata": ({"zarr.json": {"zarr_format": 3, "node_type": "group"}, "child/zarr.json": '{"zarr_format": 3,'},
                                "child/zarr.json", "malformed JSON"),
    "precomputed malformed info": ({"info": "{{"}, "info", "malformed JSON"),
    "precomputed unknown hash": ({"info": _info(sharding={"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0,
                                                         "hash": "md5", "minishard_bits": 1, "shard_bits": 1})}, "info", "hash"),
    "precomputed absurd minishard bits": ({"info": _info(sharding={"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0,
                                                                  "hash": "identity", "minishard_bits": 40, "shard_bits": 1})}, "info", "minishard_bits"),
    "precomputed key with ..": ({"info": _info(key="..")}, "info", "not a plain directory name"),
    "precomputed key with slash": ({"info": _info(key="a/../../b")}, "info", "not a plain directory name"),
    "precomputed key with NUL": ({"info": _info(key="a\u0000b")}, "info", "not a plain directory name"),
    "precomputed negative size": ({"info": _info(size=[-64, 64, 8])}, "info", "negative"),
    "empty source": ({}, "", "not a recognised store"),
}


@pytest.fixture(params=sorted(BAD))
def bad_source(request, tmp_path):
    files, where, words = BAD[request.param]
    src = tmp_path / "bad"
    src.mkdir()
    for name, content in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return src, where, words


@pytest.mark.parametrize("command", ["mount", "ls", "inspect"])
def test_bad_metadata_is_one_line_and_status_2(bad_source, command, tmp_path):
    src, where, words = bad_source
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    args = {"mount": ["mount", src, mnt], "ls": ["ls", src], "inspect": ["inspect", src]}[command]
    r = run_zvfs(*args)
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(src / where).rstrip("/") in err and words in err, err
    assert not is_mounted(mnt)


@pytest.mark.parametrize("source", ["missing", "a-file"])
def test_unusable_sources(tmp_path, source):
    path = tmp_path / source
    if source == "a-file":
        path.write_text("x")
    r = run_zvfs("ls", path)
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and str(path) in r.stderr.decode()


# --------------------------------------------------------------------------- backend faults


def write_pair(root: Path, seed: int) -> tuple[Path, Path]:
    """The same data sharded and unsharded (zarr-python, same inner codecs): the unsharded
    twin's chunk files are the bytes every mounted chunk file must have."""
    import zarr
    from zarr.codecs import ZstdCodec

    data = np.random.default_rng(seed).integers(0, 50, size=(256, 256), dtype="uint16")
    for name, shards in (("sharded.zarr", (64, 64)), ("twin.zarr", None)):
        a = zarr.create_array(root / name, shape=data.shape, chunks=(16, 16), shards=shards, dtype="uint16",
                              compressors=[ZstdCodec(level=1)], fill_value=0)
        a[...] = data
    return root / "sharded.zarr", root / "twin.zarr"


def chunk_files(twin: Path) -> dict[str, bytes]:
    return {str(p.relative_to(twin)): p.read_bytes() for p in (twin / "c").rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def served_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening-data")
    sharded, twin = write_pair(root, seed=7)
    ng = Nginx(root, tmp_path_factory.mktemp("hardening-nginx")).start()
    yield ng, sharded, twin
    ng.stop()


def test_backend_faults_give_right_bytes_or_eio_and_recover(served_pair, tmp_path):
    ng, sharded, twin = served_pair
    expected = chunk_files(twin)
    proxy = FaultProxy(ng.port, rate=0.3, seed=11, stall=2.5).start()
    proxy.faults = False  # let the metadata load cleanly
    options = ("request_timeout=1", "retry_deadline=3", "readahead=0")
    try:
        with zvfs_mount(f"{proxy.url}/{sharded.name}", tmp_path / "mnt", log=tmp_path / "zvfs.log", options=options) as mnt:
            proxy.faults = True
            ok = eio = 0
            names = sorted(expected)
            down, flaky = names[:5], names[5:]
            proxy.rate = 1.0  # the backend is down: EIO once the deadline has passed, no hang
            for rel in down:
                t = time.monotonic()
                with pytest.raises(OSError) as e:
                    (mnt / rel).read_bytes()
                assert e.value.errno == errno.EIO and time.monotonic() - t < 3 + 2 * 2.5 + 5
            proxy.rate = 0.3  # flaky: retries mostly win
            for rel in flaky:
                want = expected[rel]
                try:
                    got = (mnt / rel).read_bytes()
                except OSError as e:
                    assert e.errno == errno.EIO, (rel, e)
                    eio += 1
                    continue
                assert got == want, f"wrong bytes for {rel}"
                ok += 1
            print(f"\nfaults injected {proxy.injected}: backend down: {len(down)} EIO; flaky: {ok} files right, {eio} EIO, 0 wrong")
            assert sum(proxy.injected.values()) > 20, proxy.injected
            assert ok > len(flaky) // 2, (ok, eio)
            assert os.path.ismount(mnt)
            proxy.faults = False  # the backend recovers: everything reads, right
            for rel, want in expected.items():
                assert (mnt / rel).read_bytes() == want, rel
    finally:
        proxy.stop()
    log = (tmp_path / "zvfs.log").read_text()
    assert "Traceback" not in log


# --------------------------------------------------------------------------- load


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.parametrize("where", ["local", "http"])
def test_64_concurrent_readers(served_pair, tmp_path, where):
    ng, sharded, twin = served_pair
    expected = chunk_files(twin)
    names = sorted(expected)
    src = sharded if where == "local" else f"{ng.url}/{sharded.name}"
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        pid = int(subprocess.run(["pgrep", "-f", f"zvfs mount {src} "], capture_output=True, text=True).stdout.split()[0])
        rss_start = _rss(pid)
        errors: list[str] = []
        reads = [0] * 64
        stop = time.monotonic() + 6

        def reader(i: int) -> None:
            rng = random.Random(i)
            while time.monotonic() < stop:
                rel = rng.choice(names)
                try:
                    offset = rng.randrange(0, 2)  # reads at offsets too, not only from 0
                    with open(mnt / rel, "rb", buffering=0) as f:
                        f.seek(offset)
                        got = f.read()
                    if got != expected[rel][offset:]:
                        errors.append(f"wrong bytes: {rel}")
                except OSError as e:
                    errors.append(f"{rel}: {e}")
                reads[i] += 1

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        rss_end = _rss(pid)
    print(f"\n{where}: {sum(reads)} reads by 64 readers, RSS {rss_start >> 20} -> {rss_end >> 20} MiB")
    assert not errors, errors[:5]
    assert sum(reads) > 64 * 10
    assert rss_end - rss_start < 64 << 20


# --------------------------------------------------------------------------- credentials


def test_credentials_never_show(served_pair, tmp_path):
    ng, sharded, _ = served_pair
    url = f"http://zvuser:s3cr3tpw@127.0.0.1:{ng.port}/{sharded.name}"
    log = tmp_path / "zvfs.log"
    with zvfs_mount(url, tmp_path / "mnt", log=log, options=("debug",)) as mnt:
        assert sorted(os.listdir(mnt)) == ["c", "zarr.json"]
        mounts = Path("/proc/mounts").read_text()
        titles = []
        for pid in subprocess.run(["pgrep", "-f", "zvfs mount"], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(OSError):
                titles.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
        line = next(line for line in mounts.splitlines() if str(mnt) in line)
        assert "allow_other" not in line  # not unless asked
    inspect = run_zvfs("inspect", url).stdout.decode() + run_zvfs("inspect", "--json", url).stdout.decode()
    for where, text in (("/proc/mounts", mounts), ("process titles", "\n".join(titles)), ("log", log.read_text()), ("inspect", inspect)):
        assert "s3cr3tpw" not in text and "zvuser" not in text, where


def test_allow_other_comes_with_default_permissions(served_pair, tmp_path):
    _, sharded, _ = served_pair
    with zvfs_mount(sharded, tmp_path / "mnt", options=("allow_other",)) as mnt:
        line = next(line for line in Path("/proc/mounts").read_text().splitlines() if str(mnt) in line)
    assert "allow_other" in line and "default_permissions" in line
