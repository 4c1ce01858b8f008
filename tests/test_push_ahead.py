"""Files a walk opens next are put in the kernel's page cache ahead of their open (issue 11,
point 4: one round trip of three per file saved), through real mounts of local stores written
by zarr-python. Counted with the mount's own counters (`.zvfs.stats`: files pushed, bytes its
READ handler served); every byte read is checked against zarr-python reading the store.

- a walk in listing order reads every file but the first of each directory from pushed pages;
- opens in any other order push nothing (random access must not read what nobody asked for);
- a shard rewritten in place between the push and the open is seen: the open drops the pushed
  pages and the file reads as the new data;
- concurrent walkers of the same directories, with files held open, never hang the mount
  (a file with an open handle is never pushed: its READ may hold the page lock the push needs).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import zvfs_mount

pytestmark = pytest.mark.mount

ROWS, COLS = 4, 32  # chunks c/<i>/<j> in 2 shards of 2 x 32
#: inner chunk shapes: 512-byte files (pushed before the open answers) and 32 KiB files (pushed
#: by a task once it has answered)
INNERS = {"512B": (16, 16), "32KiB": (128, 128)}
WALKS = 6  # passes of each concurrent walker (without the rule that open files are never pushed, the mount hung in 6 of 6 runs)


def _write(root: Path, inner: tuple[int, int], seed: int) -> None:
    shape = (ROWS * inner[0], COLS * inner[1])
    a = zarr.create_array(str(root), shape=shape, shards=(shape[0] // 2, shape[1]), chunks=inner, dtype="uint16",
                          fill_value=0, compressors=None, overwrite=True)
    a[...] = np.random.default_rng(seed).integers(1, 60000, shape, dtype=np.uint16)


def _expected(root: Path) -> dict[str, bytes]:
    """Each chunk file's bytes, from zarr-python reading the store (not from zvfs)."""
    a = zarr.open_array(str(root))
    arr, (h, w) = a[...], a.chunks
    return {f"c/{i}/{j}": arr[i * h:(i + 1) * h, j * w:(j + 1) * w].astype("<u2").tobytes()
            for i in range(ROWS) for j in range(COLS)}


@pytest.fixture(params=list(INNERS))
def store(tmp_path, request):
    root = tmp_path / "store.zarr"
    _write(root, INNERS[request.param], 11)
    return root


def _chunk_bytes(store: Path) -> int:
    return int(np.prod(zarr.open_array(str(store)).chunks)) * 2


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zvfs.stats").read_text())


def _walk_order(mnt: Path) -> list[str]:
    """Every chunk file, each directory in its listing (readdir) order, as `find` gives them."""
    return [f"c/{i}/{name}" for i in sorted(os.listdir(mnt / "c"), key=int) for name in os.listdir(mnt / "c" / i)]


def test_a_walk_in_listing_order_reads_from_pushed_pages(store, tmp_path):
    expected = _expected(store)
    with zvfs_mount(store, tmp_path / "mnt") as mnt:
        files = _walk_order(mnt)
        assert sorted(files) == sorted(expected)
        for f in files:
            assert (mnt / f).read_bytes() == expected[f], f
        s = _stats(mnt)
    # the first file is read (its open starts the walk), the rest pushed: the walk goes on
    # from one directory's listing into the next one's, listed before (as `find` does)
    size = _chunk_bytes(store)
    assert s["pushed"] == len(files) - 1 and s["bytes_pushed"] == s["pushed"] * size
    assert s["bytes_served"] == size
    assert s["changed"] == 0


@pytest.mark.parametrize("order", ["reversed", "every_other"])
def test_opens_out_of_listing_order_push_nothing(store, tmp_path, order):
    expected = _expected(store)
    with zvfs_mount(store, tmp_path / "mnt") as mnt:
        files = _walk_order(mnt)
        files = files[::-1] if order == "reversed" else files[1::2] + files[::2]
        for f in files:
            assert (mnt / f).read_bytes() == expected[f], f
        s = _stats(mnt)
    assert s["pushed"] == 0
    assert s["bytes_served"] == len(files) * _chunk_bytes(store)


def test_readahead_0_pushes_nothing(store, tmp_path):
    expected = _expected(store)
    with zvfs_mount(store, tmp_path / "mnt", options=["readahead=0"]) as mnt:
        files = _walk_order(mnt)
        for f in files:
            assert (mnt / f).read_bytes() == expected[f], f
        s = _stats(mnt)
    assert s["pushed"] == 0 and s["bytes_served"] == len(files) * _chunk_bytes(store)


def test_a_shard_rewritten_in_place_after_the_push_reads_as_the_new_data(store, tmp_path):
    update = tmp_path / "update.zarr"
    _write(update, zarr.open_array(str(store)).chunks, 12)
    old, new = _expected(store), _expected(update)
    shard, new_shard = store / "c" / "0" / "0", (update / "c" / "0" / "0").read_bytes()
    with zvfs_mount(store, tmp_path / "mnt") as mnt:
        names = os.listdir(mnt / "c" / "0")
        first = f"c/0/{names[0]}"
        assert (mnt / first).read_bytes() == old[first]  # starts the walk: the next files are pushed
        assert _stats(mnt)["pushed"] > 0
        with open(shard, "r+b") as f:  # the way an in-place writer does it
            f.truncate(0)
            f.write(new_shard)
        for name in names[1:5]:
            key = f"c/0/{name}"
            assert (mnt / key).read_bytes() == new[key], f"{key}: pushed bytes of the old shard served"
        s = _stats(mnt)
    assert s["changed"] >= 4


def test_concurrent_walkers_with_files_held_open_never_hang(store, tmp_path):
    """Each walker lists each directory before walking it (every listing starts new pushes),
    so pushes keep coming while other walkers have the same files open and being read. Without
    the rule, the mount's loop soon waits in the kernel for a page lock that only its own
    answer to a READ would release (seen: the daemon stuck in `fuse_dev_write`)."""
    expected = _expected(store)
    with zvfs_mount(store, tmp_path / "mnt") as mnt:
        files = _walk_order(mnt)
        errors: list[str] = []

        def walk(first: int) -> None:
            for r in range(WALKS):
                for i in [(first + r + k) % ROWS for k in range(ROWS)]:
                    for name in os.listdir(mnt / "c" / str(i)):
                        with open(mnt / "c" / str(i) / name, "rb") as fh:
                            if fh.read() != expected[f"c/{i}/{name}"]:
                                errors.append(f"c/{i}/{name}")

        def hold() -> None:  # files held open and read again and again while the walkers pass
            handles = [open(mnt / f, "rb") for f in files[5::7]]
            try:
                for _ in range(40):
                    for fh, f in zip(handles, files[5::7]):
                        # out of the kernel's cache: every read is a READ request (a page lock)
                        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                        if os.pread(fh.fileno(), len(expected[f]), 0) != expected[f]:
                            errors.append(f)
            finally:
                for fh in handles:
                    fh.close()

        connection = Path(f"/sys/fs/fuse/connections/{os.minor(os.stat(mnt).st_dev)}/abort")
        threads = [threading.Thread(target=walk, args=(k,), daemon=True) for k in (0, 0, 1, 1, 2, 3)]
        threads.append(threading.Thread(target=hold, daemon=True))
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            connection.write_text("1")  # frees the readers and the daemon, so the mount can go
            pytest.fail("a reader hung: the mount stopped answering")
        assert not errors, errors
        assert _stats(mnt)["pushed"] > len(files)  # pushes came from many listings
