"""The consistency contract (docs/reliability.md) under random interleavings, through a real
mount of a local store.

Readers (fresh whole reads, part reads through one handle with a pause between, walks of a
directory in listing order, listings) race a writer that rewrites random shards with random
versions, in place (truncate + write, or a write over it when the new version is no shorter)
or atomically (write + rename),
while the kernel's dentries and inodes are dropped at random moments (nodes rebuilt from their
numbers, listings and indexes evicted: the mount runs with tiny caches).

Every version of every shard was written beforehand by zarr-python, with zstd, from data whose
entropy differs per version, so the chunks' compressed sizes differ and every rewrite moves
chunks inside their shard; the expected bytes of each chunk in each version are the chunk files
zarr-python writes for the same data unsharded (never anything zvfs said). A read is right when
it is exactly one version of its own chunk. The contract allows EIO, and, for a read that
overlaps an in-place write of its own bytes, a mix of versions of that same chunk (same length
as one of them, every byte from one of them); never bytes of another chunk, never a torn read
through a handle while shards are only replaced by rename, never ENOENT (every chunk is stored in
every version).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import zvfs_mount

pytestmark = pytest.mark.mount

VERSIONS = 4
READERS = 12
SECONDS = float(os.environ.get("ZVFS_STRESS_SECONDS", "12"))  # per phase; two phases per layout


class Layout:
    """An array of 16 shards: small chunks (16 per shard, one page each) or larger ones (4 per
    shard, several pages: part reads and the kernel's read-ahead span pages)."""

    def __init__(self, shape, shard, inner):
        self.shape, self.shard, self.inner = shape, shard, inner
        self.shards = [(i, j) for i in range(shape[0] // shard[0]) for j in range(shape[1] // shard[1])]
        self.chunks = [(i, j) for i in range(shape[0] // inner[0]) for j in range(shape[1] // inner[1])]
        self.rows = shape[0] // inner[0]
        self.per = shard[0] // inner[0]

    def data(self, version: int) -> np.ndarray:
        """Noise whose range differs per chunk and version: compressed sizes differ, so every
        rewrite moves chunks inside their shard. Never all zero (no chunk is ever absent)."""
        rng = np.random.default_rng(1000 + version)
        out = np.empty(self.shape, np.uint16)
        h, w = self.inner
        for ci, cj in self.chunks:
            top = 2 + (ci * 7 + cj * 13 + version * 29) % 3000
            out[ci * h:(ci + 1) * h, cj * w:(cj + 1) * w] = rng.integers(1, top, self.inner, dtype=np.uint16)
        return out


LAYOUTS = {"small": Layout((256, 256), (64, 64), (16, 16)), "large": Layout((512, 512), (128, 128), (64, 64))}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def versions(request, tmp_path_factory):
    """Shard bytes per (version, shard) and chunk bytes per (version, chunk), by zarr-python."""
    lay = LAYOUTS[request.param]
    base = tmp_path_factory.mktemp(f"stress-{request.param}")
    shards, chunks = {}, {}
    for v in range(VERSIONS):
        data = lay.data(v)
        sharded, plain = base / f"v{v}.zarr", base / f"v{v}-plain.zarr"
        zarr.create_array(str(sharded), shape=lay.shape, shards=lay.shard, chunks=lay.inner, dtype="uint16", fill_value=0)[...] = data
        zarr.create_array(str(plain), shape=lay.shape, chunks=lay.inner, dtype="uint16", fill_value=0)[...] = data
        for s in lay.shards:
            shards[v, s] = (sharded / "c" / str(s[0]) / str(s[1])).read_bytes()
        for c in lay.chunks:
            chunks[v, c] = (plain / "c" / str(c[0]) / str(c[1])).read_bytes()
    sizes = {len(chunks[v, lay.chunks[5]]) for v in range(VERSIONS)}
    assert len(sizes) == VERSIONS, "the versions must move chunks inside their shards"
    return lay, base / "v0.zarr", shards, chunks


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.wrong: list[str] = []

    def add(self, what: str, detail: str | None = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if detail and len(self.wrong) < 20:
                self.wrong.append(detail)


def _judge(got: bytes, chunk: tuple[int, int], chunks: dict, torn_allowed: bool) -> str:
    """exact (one version of this chunk), torn (a mix of versions of this chunk, byte by byte,
    where allowed), else wrong."""
    options = [chunks[v, chunk] for v in range(VERSIONS)]
    if got in options:
        return "exact"
    same_length = [o for o in options if len(o) == len(got)]
    if torn_allowed and len(same_length) > 1:  # a mix of versions of this chunk, byte by byte
        a = np.frombuffer(got, np.uint8)
        ok = np.zeros(len(a), bool)
        for o in same_length:
            ok |= a == np.frombuffer(o, np.uint8)
        if ok.all():
            return "torn"
    return "wrong"


def _reader(lay: Layout, mnt: Path, chunks: dict, stop: threading.Event, tally: Tally, seed: int, torn_allowed: bool) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        mode = rng.choice(("whole", "whole", "part", "walk", "list"))
        try:
            if mode == "list":
                row = rng.randrange(lay.rows)
                names = os.listdir(mnt / "c" / str(row))
                if not set(names) <= {str(j) for j in range(lay.rows)}:
                    tally.add("wrong", f"listing of c/{row}: {sorted(names)[:5]}")
                else:
                    tally.add("listed")
                continue
            if mode == "walk":
                row = rng.randrange(lay.rows)
                todo = [((row, int(n)), mnt / "c" / str(row) / n) for n in sorted(os.listdir(mnt / "c" / str(row)), key=int)]
            else:
                c = rng.choice(lay.chunks)
                todo = [(c, mnt / "c" / str(c[0]) / str(c[1]))]
            for chunk, path in todo:
                try:
                    with open(path, "rb") as f:
                        if mode == "part":
                            got = f.read(rng.randrange(1, len(chunks[0, chunk])))
                            time.sleep(rng.random() * 0.02)
                            got += f.read()
                        else:
                            got = f.read()
                except OSError as e:
                    if e.errno == errno.EIO:
                        tally.add("eio")
                        continue
                    if e.errno == errno.ESTALE:  # (the open and the kernel's one retry both met
                        tally.add("estale")    # handles of other versions: docs/reliability.md)
                        continue
                    tally.add("wrong", f"{mode} c/{chunk[0]}/{chunk[1]}: {e!r}")
                    continue
                verdict = _judge(got, chunk, chunks, torn_allowed)
                tally.add(f"{mode}:{verdict}" if verdict != "wrong" else "wrong",
                          None if verdict != "wrong" else f"{mode} c/{chunk[0]}/{chunk[1]}: {len(got)} bytes of neither version")
        except OSError as e:
            tally.add("wrong", f"{mode}: {e!r}")


def _writer(lay: Layout, src: Path, shards: dict, stop: threading.Event, how: tuple[str, ...], seed: int, tally: Tally) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        s = rng.choice(lay.shards)
        data = shards[rng.randrange(VERSIONS), s]
        path = src / "c" / str(s[0]) / str(s[1])
        method = rng.choice(how)
        if method == "rename":
            tmp = path.with_name(path.name + f".tmp{rng.randrange(1 << 30)}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        elif method == "truncate":  # zarr-python's LocalStore: open "wb", one write
            with open(path, "wb") as f:
                f.write(data)
        elif len(data) >= path.stat().st_size:  # overwrite in place: one write() covers the old index
            with open(path, "r+b") as f:
                f.write(data)
                f.truncate()
        else:  # (a shorter version written over a longer one leaves the old index intact over the
            # new bytes until the file is cut, which no reader can tell: outside the contract,
            # docs/reliability.md; it made 1 run in ~8 fail here with another chunk's bytes)
            with open(path, "wb") as f:
                f.write(data)
        tally.add(f"write:{method}")
        time.sleep(0.02)


def _evictor(stop: threading.Event, seed: int, tally: Tally) -> None:
    """The kernel forgets dentries and inodes: zvfs rebuilds nodes from their numbers."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(0.2, 1.0)):
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")
        tally.add("evictions")


def _phase(lay: Layout, src: Path, mnt: Path, shards: dict, chunks: dict, how: tuple[str, ...], torn_allowed: bool,
           seed: int) -> Tally:
    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=_reader, args=(lay, mnt, chunks, stop, tally, seed + i, torn_allowed)) for i in range(READERS)]
    threads += [threading.Thread(target=_writer, args=(lay, src, shards, stop, how, seed, tally)),
                threading.Thread(target=_evictor, args=(stop, seed, tally))]
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    return tally


def test_random_rewrites_never_give_another_version_or_chunk(tmp_path, versions):
    lay, original, shards, chunks = versions
    src = tmp_path / "store.zarr"
    shutil.copytree(original, src)
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=["index_cache=64K", "decoded_cache=64K"]) as mnt:
        renames = _phase(lay, src, mnt, shards, chunks, ("rename",), torn_allowed=False, seed=1)
        in_place = _phase(lay, src, mnt, shards, chunks, ("rename", "truncate", "overwrite"), torn_allowed=True, seed=2)
        # once the writer stops, every chunk reads as the version now stored
        def shard_of(c):
            return src / "c" / str(c[0] // lay.per) / str(c[1] // lay.per)

        now = {c: chunks[next(v for v in range(VERSIONS) if shards[v, (c[0] // lay.per, c[1] // lay.per)] ==
                              shard_of(c).read_bytes()), c] for c in lay.chunks}
        stale = [c for c in lay.chunks if (mnt / "c" / str(c[0]) / str(c[1])).read_bytes() != now[c]]
    for name, tally in (("rename", renames), ("in place", in_place)):
        print(name, dict(tally.counts))
    for name, tally in (("rename", renames), ("in place", in_place)):
        assert tally.counts["wrong"] == 0, f"{name}: {tally.counts['wrong']} wrong results, e.g. {tally.wrong}"
        # ESTALE is a clean error, but a rare one: every open the kernel retries once (CI has
        # seen 1 in ~13,000 opens; an open whose retry did not work would make it hundreds)
        opens = sum(n for what, n in tally.counts.items() if what.split(":")[0] in ("whole", "part", "walk", "eio", "estale"))
        assert tally.counts["estale"] <= max(2, opens // 5000), f"{name}: {tally.counts['estale']} ESTALE in {opens} opens"
        reads = sum(n for k, n in tally.counts.items() if k.split(":")[-1] in ("exact", "torn"))
        assert reads > 500, f"{name}: too few reads to mean anything: {dict(tally.counts)}"
    assert not stale, f"after the writer stopped, {len(stale)} chunks read other bytes than stored, e.g. {stale[:5]}"
