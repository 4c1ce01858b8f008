"""zvfs benchmarks: every figure is a median of N runs measured in the same run as its
baselines, with configurations alternated, and reported as a ratio (the machine is noisy).

- local: reading every chunk file of a mounted array (4 KiB, 64 KiB, 1 MiB chunks; 1 and 4
  readers) with `find | xargs cat`, against the same files in a real directory, a minimal
  pyfuse3 filesystem serving the same bytes (scripts/floorfs.py, the binding's floor),
  tensorstore reading the sharded store directly, and `cat` of the shard files.
- listing: `find` and `ls -lR` over 10^4, 10^5, 10^6 chunk files; mount time at 10^6 chunks.
- http: the same reads over HTTP (nginx on loopback) with request and byte counts.
- ocdbt: the same array inside a tensorstore OCDBT database against the plain sharded store,
  over HTTP (scripts/bench_ocdbt.py).
- latency: 10 ms added per request by a proxy: 16 readers against one.
- ml: an ML-style loader: 1, 4 and 16 worker processes read random chunk files of a large
  array through the mount over HTTP with 10 ms per request, against tensorstore reading the
  same random chunks from the sharded store over the same proxy: chunks per second and bytes
  fetched per chunk (nginx's log), side by side.
- diskcache: `-o cache_dir`: remount time and 10^3 random chunk reads (1 and 8 readers) over HTTP
  with 10 ms per request, with no disk cache (memory only: a fresh mount, and the same mount
  reading them again), a cold disk cache and a warm one (a new mount over the cache the cold
  run filled).
- views: blocks per second through the Zarr v3, Zarr v2 and N5 views (pass-through and
  transcoded N5 blocks).
- precomputed: precomputed volumes (raw: pass-through; compressed_segmentation: transcoded)
  through the Zarr v3, Zarr v2 and N5 views against tensorstore's precomputed driver
  (scripts/bench_precomputed.py).
- serve: `zvfs serve` under wrk walking every chunk file, against nginx and `python -m
  http.server` over the unsharded copy and nginx over a zvfs mount (requests/s, MB/s, CPU).
- fsspec: the fsspec front's `cat_file` per chunk file, against open/read/close through a
  mount and tensorstore reading the chunks from the shards.
- RSS peak of the daemon for each mounted run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from servers import DelayProxy, Nginx  # noqa: E402

import bench_ocdbt as ocdbt_bench  # noqa: E402  (scripts/, beside this file)
import bench_precomputed as precomputed_bench  # noqa: E402

PY = sys.executable
ZVFS = [PY, "-m", "zvfs"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- fixtures


def write_sharded(path: Path, shape, chunks, shards, dtype="uint8", seed=0, kvstore: dict | None = None) -> None:
    """Random (incompressible) data, no compressor, written by tensorstore (fast for many chunks);
    `kvstore`: where to (default: the directory `path`)."""
    import tensorstore as ts

    if path.exists():
        return
    spec = {"driver": "zarr3", "kvstore": kvstore or {"driver": "file", "path": str(path)},
            "metadata": {"shape": list(shape), "data_type": dtype, "fill_value": 0,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shards)}},
                         "codecs": [{"name": "sharding_indexed", "configuration": {
                             "chunk_shape": list(chunks), "codecs": [{"name": "bytes"}],
                             "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]}}
    t = ts.open(spec, create=True).result()
    rng = np.random.default_rng(seed)
    step = max(1, shape[0] // 16)
    for i in range(0, shape[0], step):
        stop = min(i + step, shape[0])
        t[i:stop] = rng.integers(1, 255, size=(stop - i, *shape[1:]), dtype=dtype)


@contextmanager
def mounted(src, options=(), what="zvfs", code: Path | None = None):
    """A zvfs mount of `src`; with `code`, of the zvfs in that checkout (`--also`)."""
    mnt = Path(tempfile.mkdtemp(prefix="zvfs-bench-"))
    cmd = [*ZVFS, "mount", str(src), str(mnt)] + (["-o", ",".join(options)] if options else [])
    env = None if code is None else {**os.environ, "PYTHONPATH": str(code)}
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    mount_s = time.perf_counter() - t
    pid = int(subprocess.run(["pgrep", "-f", f"zvfs mount {src} {mnt}"], capture_output=True, text=True).stdout.split()[0])
    try:
        yield mnt, pid, mount_s
    finally:
        subprocess.run([*ZVFS, "umount", str(mnt)], check=False, env=env)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        os.rmdir(mnt)


#: `--also REV`: a checkout of another commit, measured beside this one in the local section
ALSO: tuple[str, Path] | None = None


def checkout_of(rev: str, work: Path) -> tuple[str, Path]:
    """A worktree of `rev` (kept in `work` between runs)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True, capture_output=True, text=True).stdout.strip()
    path = work / f"rev-{sha}"
    if not path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha], check=True, capture_output=True)
    return sha, path


@contextmanager
def floor_mounted(backing: Path, table: Path):
    mnt = Path(tempfile.mkdtemp(prefix="floorfs-"))
    proc = subprocess.Popen([PY, str(REPO / "scripts" / "floorfs.py"), str(backing), str(table), str(mnt)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    try:
        yield mnt, proc.pid, 0.0
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        os.rmdir(mnt)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    return 0


def unsharded_copy(src: Path, dst: Path) -> None:
    if not dst.exists():
        with mounted(src) as (mnt, _, _):
            subprocess.run(["cp", "-r", str(mnt), str(dst)], check=True)


def floor_backing(tree: Path, backing: Path, table: Path) -> None:
    """One backing file with every chunk file of `tree`, and the table floorfs serves."""
    if table.exists():
        return
    off = 0
    with open(backing, "wb") as b, open(table, "w") as t:
        for p in sorted(tree.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                b.write(data)
                t.write(f"{p.relative_to(tree).as_posix()}\t{off}\t{len(data)}\n")
                off += len(data)


def read_all(root: Path, readers: int) -> float:
    """`find | xargs cat` over every chunk file; seconds."""
    per = 256 if readers == 1 else 64
    t = time.perf_counter()
    subprocess.run(f"find {root}/c -type f -print0 | xargs -0 -P {readers} -n {per} cat > /dev/null", shell=True, check=True)
    return time.perf_counter() - t


def median(xs):
    return statistics.median(xs)


# --------------------------------------------------------------------------- sections


#: the local section's arrays: name, chunk shape (uint8), chunk count
LOCAL_SIZES = [("4 KiB", (64, 64), 4096), ("64 KiB", (256, 256), 4096), ("1 MiB", (1024, 1024), 256)]


def local_sizes(quick: bool) -> list[tuple[str, tuple[int, int], int]]:
    """LOCAL_SIZES; quick: a sixteenth of the chunks (at least 64)."""
    return [(n, c, max(64, k // 16)) for n, c, k in LOCAL_SIZES] if quick else LOCAL_SIZES


def fixture_tag(name: str, count: int) -> str:
    """`4KiB` for an array of LOCAL_SIZES, `4KiB-256` for a quick one (the two never share files)."""
    full = next(k for n, _, k in LOCAL_SIZES if n == name)
    return name.replace(" ", "") + ("" if count == full else f"-{count}")


def local_fixture(work: Path, name: str, chunk, count: int) -> tuple[Path, Path]:
    """The sharded store `local-TAG.zarr` (2-d, shards of up to 8 x 8 chunks) and its unsharded
    copy `copy-TAG` (a `cp -r` of the mount); shared by the local, serve and fsspec sections."""
    side = int(round(count ** 0.5))
    shape = (side * chunk[0], (count // side) * chunk[1])
    shards = (chunk[0] * min(8, side), chunk[1] * min(8, count // side))
    tag = fixture_tag(name, count)
    src = work / f"local-{tag}.zarr"
    if not src.exists():
        log(f"local {name}: {count} chunks, writing {np.prod(shape) >> 20} MiB")
    write_sharded(src, shape, chunk, shards)
    copy = work / f"copy-{tag}"
    unsharded_copy(src, copy)
    return src, copy


def bench_local(work: Path, runs: int, quick: bool) -> list[dict]:
    rows = []
    for name, chunk, count in local_sizes(quick):
        src, copy = local_fixture(work, name, chunk, count)
        tag = fixture_tag(name, count)
        backing, table = work / f"floor-{tag}.bin", work / f"floor-{tag}.tsv"
        floor_backing(copy, backing, table)
        for readers in (1, 4):
            t = {"ext4": [], "zvfs": [], "floor": [], **({"also": []} if ALSO else {})}
            rss = 0
            for _ in range(runs):
                t["ext4"].append(read_all(copy, readers))
                with mounted(src) as (mnt, pid, _):
                    t["zvfs"].append(read_all(mnt, readers))
                    rss = max(rss, peak_rss(pid))
                with floor_mounted(backing, table) as (mnt, _, _):
                    t["floor"].append(read_all(mnt, readers))
                if ALSO:
                    with mounted(src, code=ALSO[1]) as (mnt, _, _):
                        t["also"].append(read_all(mnt, readers))
            row = {"section": "local", "chunk": name, "files": count, "readers": readers, "rss_mib": rss >> 20,
                   **{k: median(v) for k, v in t.items()}}
            if readers == 1:
                row["tensorstore"] = median([tensorstore_read(src) for _ in range(runs)])
                row["cat shards"] = median([cat_shards(src) for _ in range(runs)])
            rows.append(row)
    return rows


def tensorstore_read(src: Path) -> float:
    import tensorstore as ts

    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(src)},
                 "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
    start = time.perf_counter()
    t.read().result()
    return time.perf_counter() - start


def cat_shards(src: Path) -> float:
    t = time.perf_counter()
    subprocess.run(f"find {src}/c -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True)
    return time.perf_counter() - t


def fmt_local(r: dict) -> str:
    s = (f"| {r['chunk']} x {r['files']} | {r['readers']} | {r['ext4']:.3f} | {r['floor']:.3f} | {r['zvfs']:.3f} | "
         f"{r['zvfs'] / r['floor']:.2f} | {r['zvfs'] / r['ext4']:.2f} |")
    if "tensorstore" in r:
        s += f" {r['tensorstore']:.3f} | {r['cat shards']:.3f} |"
    else:
        s += " | |"
    s += f" {r['rss_mib']} |"
    return s + (f" {r['also'] / r['floor']:.2f} |" if "also" in r else "")


def bench_listing(work: Path, runs: int, quick: bool) -> list[dict]:
    rows = []
    counts = [10**4, 10**5] if quick else [10**4, 10**5, 10**6]
    for n in counts:
        side = round(n ** (1 / 3))
        shape = (side, side, side)
        src = work / f"list-{n}.zarr"
        log(f"listing: {n} chunks, writing")
        write_sharded(src, shape, (1, 1, 1), (max(1, side // 10), side, side))
        t = {"find": [], "ls -lR": [], "mount": []}
        for _ in range(max(1, runs // 2 if n == 10**6 else runs)):
            with mounted(src) as (mnt, pid, mount_s):
                t["mount"].append(mount_s)
                start = time.perf_counter()
                found = subprocess.run(f"find {mnt}/c -type f | wc -l", shell=True, capture_output=True, text=True).stdout
                t["find"].append(time.perf_counter() - start)
            with mounted(src) as (mnt, pid, _):
                start = time.perf_counter()
                subprocess.run(f"ls -lR {mnt} > /dev/null", shell=True, check=True)
                t["ls -lR"].append(time.perf_counter() - start)
                rss = peak_rss(pid)
        assert int(found) == side**3, found
        row = {"section": "listing", "files": side**3, "rss_mib": rss >> 20, **{k: median(v) for k, v in t.items()}}
        rows.append(row)
    return rows


def bench_dirlisting(work: Path, runs: int, quick: bool) -> list[dict]:
    """One directory of N chunk files (a 1-D array), `os.listdir` on a fresh mount, against the
    pyfuse3 floor listing the same names: the cost per entry must not grow with N."""
    rows = []
    for n in ([10**4, 10**5] if quick else [10**4, 10**5, 10**6]):
        src = work / f"flat-{n}.zarr"
        log(f"dirlisting: {n} chunks in one directory")
        write_sharded(src, (n,), (1,), (min(n, 10000),))
        table, backing = work / f"flat-{n}.tsv", work / f"flat-{n}.bin"
        if not table.exists():
            backing.write_bytes(b"x")
            table.write_text("".join(f"c/{i}\t0\t1\n" for i in range(n)))
        t = {"zvfs": [], "floor": []}
        for _ in range(max(1, runs // 2 if n == 10**6 else runs)):
            with mounted(src) as (mnt, _, _):
                start = time.perf_counter()
                assert len(os.listdir(f"{mnt}/c")) == n
                t["zvfs"].append(time.perf_counter() - start)
            with floor_mounted(backing, table) as (mnt, _, _):
                start = time.perf_counter()
                assert len(os.listdir(f"{mnt}/c")) == n
                t["floor"].append(time.perf_counter() - start)
        rows.append({"section": "dirlisting", "files": n, **{k: median(v) for k, v in t.items()}})
    return rows


def fmt_dirlisting(r, rows):
    first = rows[0]["zvfs"] / rows[0]["files"]
    per, floor = r["zvfs"] / r["files"] * 1e6, r["floor"] / r["files"] * 1e6
    return f"| {r['files']} | {per:.1f} | {floor:.1f} | {per / floor:.2f} | {per / (first * 1e6):.2f} |"


def bench_http(work: Path, runs: int, quick: bool) -> list[dict]:
    src = work / ("local-64KiB.zarr")
    count = 256 if quick else 4096
    if not src.exists():
        side = int(count ** 0.5)
        write_sharded(src, (side * 256, side * 256), (256, 256), (2048, 2048))
    copy = work / "copy-64KiB"
    unsharded_copy(src, copy)
    chunk_bytes = sum(p.stat().st_size for p in (copy / "c").rglob("*") if p.is_file())
    nfiles = sum(1 for p in (copy / "c").rglob("*") if p.is_file())
    archive = work / f"{src.name}.zip"  # the same store zipped (stored entries, as an .ozx holds them)
    if not archive.exists():
        with zipfile.ZipFile(archive, "w") as z:
            for path in sorted(src.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(src).as_posix())
    rows = []
    ng = Nginx(work, work / "nginx").start()
    try:
        for source, readers, readahead in itertools.product(("directory", "zip"), (1, 4), ("1M", "0")):
            url = f"{ng.url}/{src.name}" + (".zip" if source == "zip" else "")
            t, reqs, nbytes, rss = [], [], [], 0
            for _ in range(runs):
                with mounted(url, (f"readahead={readahead}",)) as (mnt, pid, _):
                    mark = ng.mark()
                    t.append(read_all(mnt, readers))
                    r = ng.requests(mark)
                    reqs.append(len(r))
                    nbytes.append(sum(x.nbytes for x in r))
                    rss = max(rss, peak_rss(pid))
            ext4 = median([read_all(copy, readers) for _ in range(runs)])
            rows.append({"section": "http", "source": source, "files": nfiles, "readers": readers, "readahead": readahead,
                         "seconds": median(t), "ext4": ext4, "requests": median(reqs),
                         "bytes_ratio": median(nbytes) / chunk_bytes, "rss_mib": rss >> 20})
    finally:
        ng.stop()
    return rows


def bench_latency(work: Path, runs: int, quick: bool) -> list[dict]:
    src = work / "latency.zarr"
    write_sharded(src, (16 * 256, 32 * 256), (256, 256), (1024, 1024))  # 512 x 64 KiB
    ng = Nginx(work, work / "nginx-latency").start()
    proxy = DelayProxy(ng.port, 0.010).start()
    rows = []
    try:
        url = f"{proxy.url}/{src.name}"
        for readahead in ("0", "1M"):
            t = {1: [], 16: []}
            for _ in range(max(1, runs // 2) if not quick else 1):
                for readers in (1, 16):
                    with mounted(url, (f"readahead={readahead}",)) as (mnt, _, _):
                        start = time.perf_counter()
                        per = 512 // readers
                        subprocess.run(f"find {mnt}/c -type f -print0 | xargs -0 -P {readers} -n {per} cat > /dev/null",
                                       shell=True, check=True)
                        t[readers].append(time.perf_counter() - start)
            row = {"section": "latency", "readahead": readahead, "one": median(t[1]), "sixteen": median(t[16])}
            rows.append(row)
    finally:
        proxy.stop()
        ng.stop()
    return rows


def _ml_zvfs_worker(mnt: str, files: list[str]) -> int:
    total = 0
    for f in files:
        with open(os.path.join(mnt, f), "rb") as fh:
            total += len(fh.read())
    return total


def _ml_tensorstore_worker(url: str, chunk: int, coords: list[tuple]) -> int:
    import tensorstore as ts

    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "http", "base_url": url},
                 "context": {"cache_pool": {"total_bytes_limit": 64 << 20}}}, read=True).result()
    total = 0
    for c in coords:
        total += t[tuple(slice(i * chunk, (i + 1) * chunk) for i in c)].read().result().nbytes
    return total


def bench_ml(work: Path, runs: int, quick: bool) -> list[dict]:
    """Random chunk reads by worker processes (a PyTorch-style loader), zvfs vs tensorstore."""
    import multiprocessing
    import random
    from concurrent.futures import ProcessPoolExecutor

    side, shard, chunk = (256, 128, 32) if quick else (512, 256, 32)  # the geometry
    src = work / f"ml-{side}.zarr"
    write_sharded(src, (side,) * 3, (chunk,) * 3, (shard,) * 3)
    grid = side // chunk
    reads = 256 if quick else 1024
    rng = random.Random(0)
    coords = [tuple(rng.randrange(grid) for _ in range(3)) for _ in range(reads)]
    ng = Nginx(work, work / "nginx-ml").start()
    proxy = DelayProxy(ng.port, 0.010).start()
    rows = []
    try:
        url = f"{proxy.url}/{src.name}"
        for workers in (1, 4, 16):
            parts = [coords[i::workers] for i in range(workers)]
            for what in ("zvfs", "tensorstore"):
                t, per_chunk = [], []
                for _ in range(max(1, runs // 2)):
                    with (mounted(url) if what == "zvfs" else _nothing()) as (mnt, _, _), \
                            ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                        mark = ng.mark()
                        start = time.perf_counter()
                        if what == "zvfs":
                            jobs = [pool.submit(_ml_zvfs_worker, str(mnt), ["c/" + "/".join(map(str, c)) for c in part])
                                    for part in parts]
                        else:
                            jobs = [pool.submit(_ml_tensorstore_worker, url, chunk, part) for part in parts]
                        assert sum(j.result() for j in jobs) == reads * chunk ** 3
                        t.append(time.perf_counter() - start)
                        per_chunk.append(sum(r.nbytes for r in ng.requests(mark)) / reads)
                rows.append({"section": "ml", "workers": workers, "reader": what, "chunks_per_s": reads / median(t),
                             "bytes_per_chunk": median(per_chunk), "chunk_bytes": chunk ** 3})
    finally:
        proxy.stop()
        ng.stop()
    return rows


@contextmanager
def _nothing():
    yield None, None, None


def write_views_fixture(path: Path, dtype: str, compressor: dict | None, quick: bool) -> None:
    """1024 (quick: 256) chunks of 64x64, written by tensorstore."""
    import tensorstore as ts

    if path.exists():
        return
    side = 16 if quick else 32
    codecs = [{"name": "bytes", "configuration": {"endian": "little"}}] + ([compressor] if compressor else [])
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {"shape": [side * 64, side * 64], "data_type": dtype, "fill_value": 0,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [512, 512]}},
                         "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [64, 64], "codecs": codecs}}]}}
    t = ts.open(spec, create=True).result()
    t[...] = np.random.default_rng(4).integers(1, 200, size=(side * 64, side * 64)).astype(dtype)


def bench_views(work: Path, runs: int, quick: bool) -> list[dict]:
    """Blocks per second through each view: uint8 + zstd passes through to N5 as is; uint16
    little-endian + gzip is transcoded (decode, byte-swap, raw)."""
    cases = [("uint8 zstd", "uint8", {"name": "zstd", "configuration": {"level": 3}}),
             ("uint16 gzip", "uint16", {"name": "gzip", "configuration": {"level": 5}})]
    rows = []
    for name, dtype, comp in cases:
        src = work / f"views-{dtype}.zarr"
        write_views_fixture(src, dtype, comp, quick)
        for view in ("zarr", "zarr2", "n5"):
            t, files = [], 0
            for _ in range(runs):
                with mounted(src, (f"view={view}",)) as (mnt, _, _):
                    start = time.perf_counter()
                    out = subprocess.run(f"find {mnt} -type f ! -name '*.json' ! -name '.z*' -print0 | tee /dev/stderr | "
                                         f"xargs -0 -n 256 cat > /dev/null", shell=True, check=True, capture_output=True)
                    t.append(time.perf_counter() - start)
                    files = out.stderr.count(b"\0")
            mode = "pass-through" if view != "n5" or dtype == "uint8" else "transcoded"
            row = {"section": "views", "array": name, "view": view, "mode": mode, "blocks": files, "seconds": median(t)}
            rows.append(row)
    return rows


def bench_diskcache(work: Path, runs: int, quick: bool) -> list[dict]:
    import random
    import shutil

    src = work / "diskcache.zarr"
    if not src.exists():
        write_sharded(src, (4096, 4096), (128, 128), (1024, 1024))  # 1024 x 16 KiB in 16 shards
    ng = Nginx(work, work / "nginx-diskcache").start()
    proxy = DelayProxy(ng.port, 0.010).start()
    url = f"{proxy.url}/{src.name}"
    files = [f"c/{i}/{j}" for i in range(32) for j in range(32)]
    picked = random.Random(0).sample(files, 1000)
    cache = work / "diskcache-dir"
    listed = work / "diskcache-files"
    modes = ("memory only", "memory only, same mount again", "cold disk cache", "warm disk cache")
    rows = []

    def read(mnt: Path, readers: int) -> float:
        listed.write_text("".join(f"{mnt}/{f}\0" for f in picked))
        start = time.perf_counter()
        subprocess.run(f"xargs -0 -P {readers} -n {1000 // readers} cat < {listed} > /dev/null", shell=True, check=True)
        return time.perf_counter() - start

    try:
        for readers in (1, 8):
            times: dict[str, list] = {k: [] for k in modes}
            for _ in range(runs):
                with mounted(url) as (mnt, _, mount_s):
                    times[modes[0]].append((mount_s, read(mnt, readers)))
                    times[modes[1]].append((0.0, read(mnt, readers)))
                shutil.rmtree(cache, ignore_errors=True)
                for mode in modes[2:]:
                    with mounted(url, (f"cache_dir={cache}",)) as (mnt, _, mount_s):
                        times[mode].append((mount_s, read(mnt, readers)))
            rows += [{"section": "diskcache", "readers": readers, "mode": mode, "mount": median([m for m, _ in t]),
                      "read": median([r for _, r in t])} for mode, t in times.items()]
    finally:
        proxy.stop()
        ng.stop()
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def fmt_diskcache(r, rows):
    base = next(x for x in rows if x["mode"] == "memory only" and x["readers"] == r["readers"])
    mount = "" if r["mode"].endswith("again") else f"{r['mount']:.2f}"
    return f"| {r['readers']} | {r['mode']} | {mount} | {r['read']:.2f} | {base['read'] / r['read']:.1f} |"


def fmt_listing(r, rows):
    return f"| {r['files']} | {r['mount']:.3f} | {r['find']:.2f} | {r['ls -lR']:.2f} | {r['rss_mib']} |"


def fmt_http(r, rows):
    return (f"| {r['source']} | {r['readers']} | {r['readahead']} | {r['seconds']:.2f} | {r['ext4']:.3f} | {r['requests']:.0f} | "
            f"{r['files'] / max(1, r['requests']):.1f} | {r['bytes_ratio']:.3f} | {r['rss_mib']} |")


def fmt_latency(r, rows):
    return f"| {r['readahead']} | {r['one']:.2f} | {r['sixteen']:.2f} | {r['one'] / r['sixteen']:.1f} |"


def fmt_ml(r, rows):
    return f"| {r['workers']} | {r['reader']} | {r['chunks_per_s']:.0f} | {r['bytes_per_chunk'] / r['chunk_bytes']:.2f} |"


def fmt_views(r, rows):
    base = next(x for x in rows if x["array"] == r["array"] and x["view"] == "zarr")
    return (f"| {r['array']} | {r['view']} ({r['mode']}) | {r['blocks']} | {r['blocks'] / r['seconds']:.0f} | "
            f"{base['seconds'] / r['seconds']:.2f} |")


def bench_ocdbt(work: Path, runs: int, quick: bool) -> list[dict]:
    """The http section's array inside an OCDBT database (scripts/bench_ocdbt.py)."""
    return ocdbt_bench.run(work, runs, quick, write_sharded=write_sharded, mounted=mounted, read_all=read_all,
                           median=median, peak_rss=peak_rss, nginx=Nginx)


def bench_precomputed(work: Path, runs: int, quick: bool) -> list[dict]:
    """Precomputed volumes through the array views (scripts/bench_precomputed.py)."""
    return [{"section": "precomputed", "row": row} for row in precomputed_bench.run(runs, work)]


# --------------------------------------------------------------------------- serve and fsspec fronts

#: wrk's script: each request names the next chunk file of a list (the URL paths, one a line, in
#: array order), cycling; wrk's connections share one thread, so they walk the list together
WALK_LUA = """\
local paths = {}
local i = 0
init = function(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
end
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
"""

#: seconds of each wrk run (quick: 1)
SERVE_SECONDS = 3


def chunk_paths(copy: Path) -> list[str]:
    """The chunk files of an unsharded copy, relative, in C order (`c/0/0`, `c/0/1`, ...)."""
    files = [p.relative_to(copy).as_posix() for p in (copy / "c").rglob("*") if p.is_file()]
    return sorted(files, key=lambda f: tuple(int(x) for x in f.split("/")[1:]))


def wrk(url: str, clients: int, seconds: float, script: Path, paths_file: Path) -> dict:
    """`wrk -t1 -cN` walking the chunk list: requests per second; any non-2xx answer or socket
    error fails the run (the figures would not be of chunk files)."""
    out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script),
                          url, "--", str(paths_file)], check=True, capture_output=True, text=True).stdout
    bad = [line.strip() for line in out.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    if bad:
        raise RuntimeError(f"wrk against {url}: {'; '.join(bad)}\n{out}")
    return {"rps": float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec:"))),
            "requests": int(next(line.split()[0] for line in out.splitlines() if " requests in " in line))}


def walk_once(url: str, paths: list[str], copy: Path, threads: int = 4) -> None:
    """Every chunk file once over keep-alive connections (each server's caches and the kernel's
    lookups warm before it is timed), checking status and length, and the bytes of every 61st."""
    import http.client
    import urllib.parse
    from concurrent.futures import ThreadPoolExecutor

    where = urllib.parse.urlsplit(url)

    def part(k: int) -> None:
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        try:
            for n in range(k, len(paths), threads):
                conn.request("GET", "/" + paths[n])
                r = conn.getresponse()
                body = r.read()
                want = (copy / paths[n]).stat().st_size
                if r.status != 200 or len(body) != want:
                    hint = " (zvfs serve serves only what everyone may read: a world-readable --work)" if r.status == 403 else ""
                    raise RuntimeError(f"{url}/{paths[n]}: {r.status}, {len(body)} bytes, expected 200 and {want}{hint}")
                if n % 61 == 0 and body != (copy / paths[n]).read_bytes():
                    raise RuntimeError(f"{url}/{paths[n]}: not the bytes of the copy")
                if r.getheader("connection", "").lower() == "close" or r.version == 10:
                    conn.close()
        finally:
            conn.close()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(part, range(threads)))


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def python_server(args):
    """A Python HTTP server on a free loopback port (`args(port)`: its arguments); its URL."""
    from servers import _wait_port, free_port

    port = free_port()
    proc = subprocess.Popen([PY, *args(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def http_server(root: Path):
    """`python -m http.server` over `root`: what users run today."""
    return python_server(lambda port: ["-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)])


def hypercorn_floor(root: Path):
    """scripts/floorhttp.py over `root`: the smallest app on the server zvfs serve runs on."""
    return python_server(lambda port: [str(REPO / "scripts" / "floorhttp.py"), str(root), str(port)])


@contextmanager
def nginx_over(root: Path, workdir: Path):
    ng = Nginx(root, workdir, autoindex=False).start()
    try:
        yield ng.url
    finally:
        ng.stop()


@contextmanager
def zvfs_serving(src: Path, log_path: Path, *args: str):
    from servers import ZvfsServe

    server = ZvfsServe(src, *args, log=log_path).start()
    try:
        yield server
    finally:
        server.stop()


#: the servers of the serve section, in the order they are run (and shown)
SERVERS = ["zvfs serve", "zvfs serve --no-access-log", "zvfs serve --workers CORES", "hypercorn floor over copy",
           "nginx over copy", "http.server over copy", "nginx over zvfs mount"]


def bench_serve(work: Path, runs: int, quick: bool) -> list[dict]:
    """`zvfs serve` against nginx over the unsharded copy, `python -m http.server` over the copy,
    nginx over a zvfs mount, and the floor of its server (scripts/floorhttp.py: the smallest app
    on hypercorn's trio worker, over the copy): requests per second of wrk walking every chunk
    file, one and 16 connections (quick: 16); all seven servers up at once (zvfs serve also with
    `--workers` = the machine's cores, its access log off), the runs alternated.
    MB/s is requests/s times the chunk file's size; CPU is the zvfs process's (serve, or the
    mount's daemon under nginx: nginx's own is not counted) per request."""
    if subprocess.run(["sh", "-c", "command -v wrk"], capture_output=True, check=False).returncode:
        raise SystemExit("bench: the serve section needs wrk (scripts/setup installs it)")
    from contextlib import ExitStack

    seconds = 1 if quick else SERVE_SECONDS
    script = work / "walk.lua"
    script.write_text(WALK_LUA)
    rows = []
    for name, chunk, count in local_sizes(quick):
        src, copy = local_fixture(work, name, chunk, count)
        paths = chunk_paths(copy)
        size = int(np.prod(chunk))
        tag = fixture_tag(name, count)
        paths_file = work / f"serve-paths-{tag}.txt"
        paths_file.write_text("".join(f"/{p}\n" for p in paths))
        with ExitStack() as stack:
            urls, pids = {}, {}
            urls["nginx over copy"] = stack.enter_context(nginx_over(copy, work / f"nginx-serve-{tag}"))
            urls["http.server over copy"] = stack.enter_context(http_server(copy))
            urls["hypercorn floor over copy"] = stack.enter_context(hypercorn_floor(copy))
            mnt, pids["nginx over zvfs mount"], _ = stack.enter_context(mounted(src))
            urls["nginx over zvfs mount"] = stack.enter_context(nginx_over(mnt, work / f"nginx-serve-mount-{tag}"))
            for what, extra in (("zvfs serve", ()), ("zvfs serve --no-access-log", ("--no-access-log",)),
                                ("zvfs serve --workers CORES", ("--no-access-log", "--workers", str(os.cpu_count())))):
                server = stack.enter_context(zvfs_serving(src, work / f"serve-{tag}-{len(extra)}.log", *extra))
                urls[what] = server.url
                if "--workers" not in extra:  # (the workers' CPU is not the parent's)
                    pids[what] = server.proc.pid
            for what in SERVERS:
                log(f"serve {name}: warming {what}")
                walk_once(urls[what], paths, copy)
            for clients in ((16,) if quick else (1, 16)):
                rps: dict[str, list[float]] = {k: [] for k in SERVERS}
                cpu: dict[str, list[float]] = {k: [] for k in pids}
                for _ in range(runs):
                    for what in SERVERS:
                        before = cpu_seconds(pids[what]) if what in pids else 0.0
                        got = wrk(urls[what], clients, seconds, script, paths_file)
                        rps[what].append(got["rps"])
                        if what in pids:
                            cpu[what].append((cpu_seconds(pids[what]) - before) / got["requests"])
                served = median(rps["zvfs serve"])
                for what in SERVERS:
                    rows.append({"section": "serve", "chunk": name, "files": len(paths), "clients": clients,
                                 "server": what, "rps": median(rps[what]), "mb_s": median(rps[what]) * size / 1e6,
                                 "serve_vs": served / median(rps[what]),
                                 "cpu_us": median(cpu[what]) * 1e6 if what in cpu else None})
                log(f"serve {name}, {clients} clients: " + ", ".join(f"{k} {median(v):.0f}/s" for k, v in rps.items()))
    return rows


def fmt_serve(r, rows):
    cpu = "" if r["cpu_us"] is None else f"{r['cpu_us']:.0f}"
    return (f"| {r['chunk']} x {r['files']} | {r['clients']} | {r['server']} | {r['rps']:.0f} | {r['mb_s']:.1f} | "
            f"{r['serve_vs']:.2f} | {cpu} |")


def _fsspec_worker(kind: str, root: str, files: list[str], threads: int, size: int, chunk: list[int]) -> float:
    """One pass over `files` by `threads` threads of a fresh reader (opened before the clock
    starts): `fsspec` (`fs.cat_file` on a new zvfs filesystem), `mount` (os.open + os.read +
    os.close through the kernel), `tensorstore` (the zarr3 driver reading each chunk as an
    array from the sharded store). Seconds."""
    import threading

    if kind == "fsspec":
        import fsspec

        fs = fsspec.filesystem("zvfs", fo=root, skip_instance_cache=True)
        fs.info("zarr.json")  # (the source opened before the clock starts, as the others')

        def read(f: str) -> int:
            return len(fs.cat_file(f))
    elif kind == "mount":
        def read(f: str) -> int:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                return len(os.read(fd, size))
            finally:
                os.close(fd)
    else:
        import tensorstore as ts

        arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": root},
                       "context": {"cache_pool": {"total_bytes_limit": 64 << 20}}}, read=True).result()

        def read(f: str) -> int:
            at = [int(x) for x in f.split("/")[1:]]
            return arr[tuple(slice(i * c, (i + 1) * c) for i, c in zip(at, chunk))].read().result().nbytes

    got = [0] * threads

    def part(k: int) -> None:
        got[k] = sum(read(f) for f in files[k::threads])

    workers = [threading.Thread(target=part, args=(k,)) for k in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - start
    assert sum(got) == size * len(files), (kind, sum(got))
    return took


def bench_fsspec(work: Path, runs: int, quick: bool) -> list[dict]:
    """The fsspec front's cost per chunk file: `fs.cat_file` of every chunk file once, against
    open + read + close of the same files through a zvfs mount and tensorstore reading the same
    chunks from the shards; each a fresh reader (a new source, a new mount, a new tensorstore)
    in a process of its own, one pass, the shards in the page cache; alternated."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    rows = []
    for name, chunk, count in local_sizes(quick):
        src, copy = local_fixture(work, name, chunk, count)
        files = chunk_paths(copy)
        size = int(np.prod(chunk))
        for threads in ((4,) if quick else (1, 4)):
            t: dict[str, list[float]] = {"fsspec": [], "mount": [], "tensorstore": []}
            for _ in range(runs):
                for kind, took in t.items():
                    with (mounted(src) if kind == "mount" else _nothing()) as (mnt, _, _), \
                            ProcessPoolExecutor(1, mp_context=ctx) as pool:
                        root = str(mnt if kind == "mount" else src)
                        took.append(pool.submit(_fsspec_worker, kind, root, files, threads, size, list(chunk)).result())
            rows.append({"section": "fsspec", "chunk": name, "files": len(files), "threads": threads,
                         **{k: median(v) / len(files) * 1e6 for k, v in t.items()}})
    return rows


def fmt_fsspec(r, rows):
    return (f"| {r['chunk']} x {r['files']} | {r['threads']} | {r['fsspec']:.0f} | {r['mount']:.0f} | "
            f"{r['tensorstore']:.0f} | {r['fsspec'] / r['mount']:.2f} | {r['fsspec'] / r['tensorstore']:.2f} |")


#: name -> (title, table header, benchmark, row formatter)
SECTIONS = {
    "local": ("Reading every chunk file (find | xargs cat), seconds; ratios zvfs/floor and zvfs/ext4",
              ["chunks", "readers", "ext4 dir", "pyfuse3 floor", "zvfs", "zvfs/floor", "zvfs/ext4",
               "tensorstore (sharded)", "cat shards", "zvfs RSS MiB"], bench_local, lambda r, rows: fmt_local(r)),
    "listing": ("Listing, seconds (fresh mount each)", ["chunk files", "mount", "find", "ls -lR", "RSS MiB"],
                bench_listing, fmt_listing),
    "dirlisting": ("One directory of N chunk files, os.listdir on a fresh mount: µs per entry",
                   ["entries", "zvfs", "pyfuse3 floor", "zvfs/floor", "vs 10^4 entries"], bench_dirlisting, fmt_dirlisting),
    "http": ("Over HTTP (nginx on loopback), 64 KiB chunks: seconds, requests (nginx log), bytes / chunk bytes",
             ["source", "readers", "readahead", "zvfs over HTTP", "ext4 dir", "requests", "chunks per request", "bytes ratio", "RSS MiB"],
             bench_http, fmt_http),
    "ocdbt": (ocdbt_bench.TITLE, ocdbt_bench.HEADER, bench_ocdbt, ocdbt_bench.fmt),
    "latency": ("10 ms per request (delay proxy), 512 x 64 KiB over HTTP: 1 vs 16 readers, seconds",
                ["readahead", "1 reader", "16 readers", "speed-up"], bench_latency, fmt_latency),
    "ml": (("ML-style random chunk reads, 10 ms per request: chunks per second and bytes fetched per chunk "
            "(as a multiple of the 32 KiB chunk; the first read of each shard also fetches its index)"),
           ["workers", "reader", "chunks/s", "bytes fetched / chunk"], bench_ml, fmt_ml),
    "diskcache": (("Disk cache (-o cache_dir), 10 ms per request (delay proxy) over HTTP: remount, and 10^3 random "
                   "16 KiB chunk files read by 1 and 8 readers, seconds"),
                  ["readers", "cache", "mount", "10^3 random chunks", "speed-up"], bench_diskcache, fmt_diskcache),
    "views": ("Views: reading every block/chunk file of a 1024-chunk array (quick: 256), blocks per second",
              ["array", "view", "blocks", "blocks/s", "vs zarr view"], bench_views, fmt_views),
    "precomputed": (precomputed_bench.TITLE, precomputed_bench.HEADER, bench_precomputed, lambda r, rows: r["row"]),
    "serve": (("zvfs serve: wrk walking every chunk file (keep-alive, -t1 -cN) against nginx, python -m "
               "http.server and the smallest app on hypercorn's trio worker (the floor of serve's server: "
               "scripts/floorhttp.py) over the unsharded copy and nginx over a zvfs mount, all up at once, alternated; "
               "requests/s, MB/s (of chunk bytes), zvfs serve's requests/s over this server's, CPU of the zvfs "
               "process per request"),
              ["chunks", "clients", "server", "req/s", "MB/s", "zvfs serve ÷ this", "zvfs CPU µs/req"],
              bench_serve, fmt_serve),
    "fsspec": (("fsspec front: µs per chunk file, every chunk file read once by a fresh reader (fs.cat_file; "
                "open+read+close through a zvfs mount; tensorstore zarr3 reading each chunk from the shards)"),
               ["chunks", "threads", "fsspec cat_file", "mount", "tensorstore", "fsspec/mount", "fsspec/tensorstore"],
               bench_fsspec, fmt_fsspec),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--runs", type=int, help="repetitions per figure (median; default 5, with --quick 1)")
    ap.add_argument("--only", default="local,listing,dirlisting,http,ocdbt,latency,ml,diskcache,views,precomputed,serve,fsspec")
    ap.add_argument("--work", default="/var/tmp/zvfs-bench", help="where fixtures are written (kept between runs)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--also", metavar="REV", help="local section: also the zvfs of commit REV, alternated with the others "
                                                  "(a last column REV/floor)")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    global ALSO
    if args.also:
        ALSO = checkout_of(args.also, work)
        SECTIONS["local"][1].append(f"{ALSO[0]}/floor")
    sections = args.only.split(",")
    results = []
    runs = args.runs or (1 if args.quick else 5)
    print(f"zvfs benchmarks, medians of {runs} runs, {os.cpu_count()} cores")
    for name, (title, header, bench, fmt) in SECTIONS.items():
        if name not in sections:
            continue
        print(f"\n{title}\n| {' | '.join(header)} |\n|{'---|' * len(header)}", flush=True)
        rows = bench(work, runs, args.quick)
        for r in rows:
            print(fmt(r, rows), flush=True)
        results += rows
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
