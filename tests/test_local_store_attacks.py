"""The local store under attack: changed shards, FIFOs, stalled filesystems, symlinks that
leave the store or loop, and permissions (issue 10).

The first half drives `LocalStore` directly (no FUSE); the second half mounts zarr-python
stores through the kernel, where the behaviour is what a user sees: `find` and `cp -r`
terminating, other users of an `allow_other` mount reading nothing they could not read in the
store, a FIFO shard costing only its own files.

The stalled filesystem is a real one: a tiny pyfuse3 filesystem (`STALL_FS`, run as its own
process) mounted inside the store, whose reads never answer and whose lookup of `hang` never
answers, like a hard NFS mount whose server went away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import trio
from conftest import force_unmount, is_mounted, zvfs_mount

from zvfs.errors import ShardChanged, StorageError
from zvfs.storage.local import THREADS_PER_MOUNT, LocalStore

# ----------------------------------------------------------------------------------------------
# helpers


def stat_tag(path) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def unstick_fifo_later(fifo, seconds: float) -> threading.Timer:
    """A watchdog: if something is still blocked opening FIFO for reading after SECONDS, open
    it for writing, which lets that open return, so a regression fails instead of hanging."""

    def unstick():
        with contextlib.suppress(OSError):  # ENXIO: nobody is waiting, good
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, unstick)
    timer.start()
    return timer


def rewrite_in_place(path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def cache_range(path, start: int, length: int) -> None:
    """Bring bytes [start, start+length) of PATH into the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, length, start)
    finally:
        os.close(fd)


def drop_page_cache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def walk(store: LocalStore, prefix: str = "", limit: int = 10_000) -> set[str]:
    """Every key and directory below `prefix` as store.list shows them (bounded, so a loop
    fails the test instead of hanging it)."""
    seen: set[str] = set()
    todo = [prefix]
    while todo:
        p = todo.pop()
        for e in await store.list(p) or []:
            key = f"{p}/{e.name}" if p else e.name
            seen.add(key)
            assert len(seen) < limit, f"listing does not end: {sorted(seen)[:20]}"
            if e.is_dir:
                todo.append(key)
    return seen


# ----------------------------------------------------------------------------------------------
# versions


async def test_versions_follow_rewrite_replace_truncate_and_delete(public_tmp):
    tmp_path = public_tmp  # (modes are the bits a reader has: every directory above is open)
    shard = tmp_path / "shard"
    shard.write_bytes(b"A" * 1000)
    store = LocalStore(str(tmp_path))
    try:
        data, v1 = await store.read_version("shard", 0, 10)
        st = os.stat(shard)
        assert data == b"A" * 10 and v1.size == 1000 and v1.tag == stat_tag(shard)
        assert v1.mode == stat.S_IMODE(st.st_mode) and v1.mtime_ns == st.st_mtime_ns
        assert (await store.current("shard")).same(v1)

        # atomic replace: the path is v2; the old file's ctime moved when it lost its name,
        # so even its open descriptor no longer counts as v1 (never the new bytes)
        (tmp_path / "new").write_bytes(b"B" * 900)
        os.replace(tmp_path / "new", shard)
        with pytest.raises(ShardChanged):
            await store.read("shard", 0, 10, expect=v1)
        v2 = await store.current("shard")
        assert v2.size == 900 and v2.tag == stat_tag(shard) and not v2.same(v1)
        with pytest.raises(ShardChanged):
            await store.read("shard", 0, 10, expect=v1)
        assert await store.read("shard", 0, 10, expect=v2) == b"B" * 10

        # in-place rewrite of the same length: same inode, other bytes
        rewrite_in_place(shard, b"C" * 900)
        with pytest.raises(ShardChanged):
            await store.read("shard", 0, 10, expect=v2)
        v3 = await store.current("shard")
        assert v3.tag == stat_tag(shard) and v3.tag[:2] == v2.tag[:2] and not v3.same(v2)
        assert await store.read_version("shard", 5, 3) == (b"CCC", v3)

        os.truncate(shard, 5)
        with pytest.raises(ShardChanged):
            await store.read("shard", 0, 10, expect=v3)
        v4 = await store.current("shard")
        assert v4.size == 5 and await store.read("shard", -10, expect=v4) == b"C" * 5

        shard.unlink()
        assert await store.current("shard") is None
        assert await store.read("shard", 0, 1) is None
        assert await store.read_version("shard") == (None, None)
        with pytest.raises(ShardChanged):
            await store.read("shard", 0, 1, expect=v4)
    finally:
        await store.aclose()


async def test_replaced_shard_is_noticed_after_descriptor_cache_turnover(tmp_path):
    """The reported bug: once the descriptor of a replaced shard was evicted, reads went to
    the new file at offsets taken from the old index (silent wrong bytes)."""
    (tmp_path / "shard").write_bytes(b"old!" * 64)
    (tmp_path / "other").write_bytes(b"x")
    store = LocalStore(str(tmp_path), max_open_files=1)
    try:
        _, v1 = await store.read_version("shard", 0, 16)
        await store.read("other", 0, 1)  # evicts the shard's descriptor
        (tmp_path / "new").write_bytes(b"new!" * 64)  # same size, other bytes
        os.replace(tmp_path / "new", tmp_path / "shard")
        with pytest.raises(ShardChanged):
            await store.read("shard", 0, 16, expect=v1)
        assert await store.read("shard", 0, 8, expect=await store.current("shard")) == b"new!new!"
    finally:
        await store.aclose()


async def test_uncached_and_partly_cached_ranges_read_right(tmp_path):
    """Reads the page cache cannot answer go to a worker thread; partly cached ranges and
    ranges past the end must come back exactly as the file has them."""
    rng = np.random.default_rng(1)
    blob = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "shard"
    path.write_bytes(blob)
    store = LocalStore(str(tmp_path))
    try:
        for start, length in [(0, 4096), (1 << 20, 300_000), (len(blob) - 100, 4096), (5, None),
                              (-70_000, None), (len(blob) + 10, 10)]:
            drop_page_cache(path)
            cache_range(path, max(0, start if start >= 0 else len(blob) + start), 2048)
            want = blob[start:] if length is None else blob[start:start + length]
            data, v = await store.read_version("shard", start, length)
            assert data == want and v.tag == stat_tag(path)
            drop_page_cache(path)
            assert await store.read("shard", start, length, expect=v) == want
        assert await store.size("shard") == len(blob)
    finally:
        await store.aclose()


async def test_reads_from_a_memory_filesystem():
    """tmpfs refuses RWF_NOWAIT: reads of a store in /dev/shm take another way, same bytes."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        assert ["/dev/shm", "tmpfs"] in [[m[4], m[m.index("-") + 1]] for m in mounts]
        blob = np.random.default_rng(2).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
        Path(d, "shard").write_bytes(blob)
        store = LocalStore(d)
        try:
            data, v = await store.read_version("shard", -1000)
            assert data == blob[-1000:] and v.tag == stat_tag(Path(d, "shard"))
            for start, length in [(0, 4096), (70_000, 200_000), (len(blob) - 10, 4096), (5, None)]:
                want = blob[start:] if length is None else blob[start:start + length]
                assert await store.read("shard", start, length, expect=v) == want
            rewrite_in_place(Path(d, "shard"), b"y" * 10)
            with pytest.raises(ShardChanged):
                await store.read("shard", 0, 10, expect=v)
        finally:
            await store.aclose()


# ----------------------------------------------------------------------------------------------
# special files, symlinks, loops, modes


@pytest.fixture
def special_store(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / "good").write_bytes(b"good bytes")
    os.mkfifo(root / "fifo")
    (root / "to_fifo").symlink_to("fifo")
    os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    watchdog = unstick_fifo_later(root / "fifo", 15)
    yield root
    watchdog.cancel()
    sock.close()


async def test_fifos_sockets_and_devices_are_refused_without_blocking(special_store):
    store = LocalStore(str(special_store))
    try:
        with trio.fail_after(10):  # an open(2) of the FIFO used to block the loop for good
            for key in ("fifo", "to_fifo", "null", "sock"):
                for call in (store.read(key, 0, 10), store.read_version(key), store.size(key),
                             store.current(key)):
                    with pytest.raises(StorageError, match=key):
                        await call
            assert await store.read("good") == b"good bytes"
            assert sorted(e.name for e in await store.list("")) == ["good"]
    finally:
        await store.aclose()


@pytest.fixture
def symlink_store(tmp_path):
    """A store with links that lead out (a file, a directory) and links that stay inside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("root's secret\n")
    root = tmp_path / "store"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_bytes(b"inside")
    (root / "leak").symlink_to(outside / "secret")
    (root / "leak_rel").symlink_to("../outside/secret")
    (root / "outdir").symlink_to(outside)
    (root / "inside").symlink_to("sub/f")
    (root / "insidedir").symlink_to("sub")
    return root


async def test_symlinks_that_leave_the_store_are_not_followed(symlink_store):
    store = LocalStore(str(symlink_store))
    try:
        for key in ("leak", "leak_rel", "outdir/secret", "../outside/secret"):  # keys from metadata too
            with pytest.raises(StorageError, match="outside the store"):
                await store.read(key)
            with pytest.raises(StorageError, match="outside the store"):
                await store.current(key)
        assert {e.name for e in await store.list("")} == {"sub", "inside", "insidedir"}
        assert await store.list("outdir") is None
        assert await store.list("..") is None
        assert await store.read("inside") == b"inside"
        assert await store.read("insidedir/f") == b"inside"
        assert await walk(store) == {"sub", "sub/f", "inside", "insidedir", "insidedir/f"}
    finally:
        await store.aclose()

    trusting = LocalStore(str(symlink_store), follow_symlinks=True)
    try:
        assert await trusting.read("leak") == b"root's secret\n"
        assert await trusting.read("outdir/secret") == b"root's secret\n"
        assert {"leak", "leak_rel", "outdir"} <= {e.name for e in await trusting.list("")}
    finally:
        await trusting.aclose()


async def test_a_symlink_swapped_in_after_the_first_open_is_judged_again(symlink_store):
    """What is checked is the file actually opened: a key that was fine when first read and
    is then replaced by a link to the outside is refused on its next open."""
    store = LocalStore(str(symlink_store), max_open_files=1)
    try:
        assert await store.read("sub/f") == b"inside"
        await store.read("inside")  # evicts sub/f's descriptor
        os.rename(symlink_store / "sub" / "f", symlink_store / "f.moved")
        (symlink_store / "sub" / "f").symlink_to(symlink_store.parent / "outside" / "secret")
        with pytest.raises(StorageError, match="outside the store"):
            await store.read("sub/f")
    finally:
        await store.aclose()


async def test_symlink_loops_are_not_listed(tmp_path):
    root = tmp_path / "store"
    for d in ("junk", "x", "z"):
        (root / d).mkdir(parents=True)
    (root / "junk" / "a").symlink_to(".")
    (root / "x" / "fx").write_bytes(b"1")
    (root / "z" / "fz").write_bytes(b"2")
    (root / "x" / "to_z").symlink_to("../z")
    (root / "z" / "to_x").symlink_to("../x")
    (root / "up").symlink_to("..")  # the store's parent: outside
    store = LocalStore(str(root))
    try:
        with trio.fail_after(30):
            assert await walk(store) == {
                "junk", "x", "x/fx", "x/to_z", "x/to_z/fz", "z", "z/fz", "z/to_x", "z/to_x/fx"}
    finally:
        await store.aclose()


async def test_listings_carry_modes_and_mtimes(public_tmp):
    tmp_path = public_tmp  # (modes are the bits a reader has: every directory above is open)
    (tmp_path / "d").mkdir(mode=0o750)
    (tmp_path / "d").chmod(0o750)
    (tmp_path / "private").write_bytes(b"p")
    (tmp_path / "private").chmod(0o600)
    os.utime(tmp_path / "private", ns=(1_600_000_000 * 10**9, 1_600_000_000_250_000_123))
    store = LocalStore(str(tmp_path))
    try:
        got = {e.name: e for e in await store.list("")}
        for name in ("d", "private"):
            st = os.stat(tmp_path / name)
            assert (got[name].mode, got[name].mtime_ns) == (stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        assert got["private"].mode == 0o600 and got["private"].mtime_ns == 1_600_000_000_250_000_123  # (to the nanosecond)
        v = await store.current("private")
        assert (v.mode, v.mtime_ns) == (0o600, 1_600_000_000_250_000_123)
    finally:
        await store.aclose()


# ----------------------------------------------------------------------------------------------
# a stalled filesystem inside the store

STALL_FS = r'''
import errno, os, stat, sys, pyfuse3, trio

SIZE = int(sys.argv[2])

class Stalled(pyfuse3.Operations):
    """One file `0` of SIZE bytes whose reads never answer; a lookup of `hang` never answers;
    once MOUNTPOINT.stall-all exists, nothing answers."""

    def _attr(self, ino):
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = (stat.S_IFDIR | 0o755) if ino == 1 else (stat.S_IFREG | 0o644)
        a.st_size = 0 if ino == 1 else SIZE
        a.attr_timeout = a.entry_timeout = 0
        return a

    async def getattr(self, ino, ctx=None):
        if os.path.exists(sys.argv[1] + ".stall-all"):  # from now on, like a dead NFS server
            await trio.sleep_forever()
        return self._attr(ino)

    async def lookup(self, parent, name, ctx=None):
        if name == b"hang":
            await trio.sleep_forever()
        if parent == 1 and name == b"0":
            return self._attr(2)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, ino, ctx):
        return ino

    async def readdir(self, fh, off, token):
        if off == 0:
            pyfuse3.readdir_reply(token, b"0", self._attr(2), 1)

    async def open(self, ino, flags, ctx):
        return pyfuse3.FileInfo(fh=ino)

    async def read(self, fh, off, size):
        await trio.sleep_forever()

    async def flush(self, fh):  # close(2) waits for this
        if os.path.exists(sys.argv[1] + ".stall-all"):
            await trio.sleep_forever()

pyfuse3.init(Stalled(), sys.argv[1], ["fsname=stallfs", "subtype=stallfs", "ro"])
trio.run(pyfuse3.main)
'''


@contextlib.contextmanager
def stalled_fs(mnt: Path, size: int, watchdog: float = 40):
    """Mount STALL_FS on MNT and yield a function that kills it (its pending requests fail);
    on exit kill it and unmount. After WATCHDOG seconds it is killed anyway, so a regression
    that blocks on it fails instead of hanging the test run."""
    mnt.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", STALL_FS, str(mnt), str(size)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            assert proc.poll() is None, "the stalled filesystem did not start"
            assert time.monotonic() < deadline, "the stalled filesystem did not mount"
            time.sleep(0.05)
        timer = threading.Timer(watchdog, proc.kill)
        timer.start()
        yield proc.kill
        timer.cancel()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        force_unmount(mnt)


async def test_a_stalled_mount_costs_only_its_own_files(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / "good").write_bytes(b"good bytes")
    for i in range(THREADS_PER_MOUNT + 4):
        (root / f"more{i}").write_bytes(b"more")
        (root / f"link{i}").symlink_to(f"more{i}")  # opened in a worker thread, not the loop
    with stalled_fs(root / "stalled", 1 << 20):
        store = LocalStore(str(root))
        try:
            with trio.fail_after(10):  # what the stalled filesystem still answers
                assert [e.name for e in await store.list("stalled")] == ["0"]
                assert await store.size("stalled/0") == 1 << 20
            async with trio.open_nursery() as nursery:
                # more hung calls than the stalled mount has threads: reads and opens
                for _ in range(THREADS_PER_MOUNT + 2):
                    nursery.start_soon(store.read, "stalled/0", 0, 4096)
                    nursery.start_soon(store.read, "stalled/hang", 0, 1)
                await trio.sleep(0.5)
                with trio.fail_after(10):
                    assert await store.read("good", 0, 4) == b"good"
                    assert (await store.current("good")).size == 10
                    for i in range(THREADS_PER_MOUNT + 4):  # fresh opens, on the loop and in threads
                        assert await store.read(f"more{i}") == b"more"
                        assert await store.read(f"link{i}") == b"more"
                    assert {e.name for e in await store.list("")} >= {"good", "stalled"}
                (root / "stalled.stall-all").touch()  # now even a stat of its root hangs
                with trio.fail_after(10):
                    for _ in range(THREADS_PER_MOUNT + 2):
                        got = {e.name: e.is_dir for e in await store.list("")}
                        assert got["stalled"] and got["good"] is False
                    assert await store.read("more0") == b"more"
                nursery.cancel_scope.cancel()
        finally:
            with trio.fail_after(10):  # closing stalled/0 must not wait for its FLUSH
                await store.aclose()


# ----------------------------------------------------------------------------------------------
# through a real mount

SHAPE, SHARD, INNER = (64, 64), (32, 32), (8, 8)  # 2x2 shards of 4x4 inner chunks
READER = "zvfsreader"  # the other user of allow_other mounts

COMPARE = """
import sys, numpy as np, zarr
a, b = (zarr.open_array(p, mode="r") for p in sys.argv[1:3])
region = eval("np.s_[" + sys.argv[3] + "]")
assert np.array_equal(a[region], b[region]), "different data"
print("same")
"""


def write_zarr_store(root: Path) -> None:
    """Two sharded arrays written by zarr-python, `a` and `b`, with distinct data."""
    import zarr

    group = zarr.open_group(str(root), mode="w")
    for i, name in enumerate(("a", "b")):
        arr = group.create_array(name, shape=SHAPE, chunks=INNER, shards=SHARD, dtype="uint16",
                                 compressors=None)
        arr[...] = np.arange(SHAPE[0] * SHAPE[1], dtype="uint16").reshape(SHAPE) * (i + 1) + 1


def same_as_original(mounted: Path, original: Path, region: str = "...", timeout: float = 30) -> None:
    """zarr-python reads REGION of the array through the mount and from the original, in a
    process of its own (a hung mount fails the test instead of hanging it)."""
    r = subprocess.run([sys.executable, "-c", COMPARE, str(mounted), str(original), region],
                       check=False, capture_output=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip() == b"same", r.stderr.decode()[-2000:]


def log_lines(log: Path, needle: str) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if needle in line]


def test_a_fifo_shard_costs_its_files_not_the_mount(tmp_path):
    root = tmp_path / "store.zarr"
    write_zarr_store(root)
    shard = root / "a" / "c" / "1" / "1"  # inner chunks 4-7 x 4-7
    shard.unlink()
    os.mkfifo(shard)
    watchdog = unstick_fifo_later(shard, 50)  # after the readers' timeouts: they must fail
    log = tmp_path / "zvfs.log"
    try:
        with zvfs_mount(root, tmp_path / "mnt", log=log) as mnt:
            reader = subprocess.Popen([sys.executable, "-c", COMPARE, str(mnt / "b"), str(root / "b"), "..."],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for chunk in ("5/5", "4/7", "5/5"):
                r = subprocess.run(["cat", str(mnt / "a" / "c" / chunk)], check=False, capture_output=True, timeout=30)
                assert r.returncode != 0 and b"Input/output error" in r.stderr, r
            out, err = reader.communicate(timeout=30)
            assert reader.returncode == 0 and out.strip() == b"same", err.decode()[-2000:]
            same_as_original(mnt / "a", root / "a", "0:32, :")  # the other shards of a
            assert os.stat(mnt / "a" / "c" / "0" / "0").st_size == 2 * INNER[0] * INNER[1]
        lines = log_lines(log, "a/c/1/1")
        assert lines and all("FIFO" in line for line in lines), log.read_text()[-2000:]
    finally:
        watchdog.cancel()


def test_a_stalled_filesystem_inside_the_store_costs_only_its_files(tmp_path):
    """A hung mount under the store (here: reads never answer) holds up the chunk files whose
    shard lives on it, and nothing else; once it fails, so do they (EIO), and the mount is
    still fine."""
    root = tmp_path / "store.zarr"
    write_zarr_store(root)
    size = (root / "a" / "c" / "1" / "0").stat().st_size  # shard (1, 0): inner chunks 4-7 x 0-3
    with stalled_fs(root / "a" / "c" / "1", size) as kill, \
            zvfs_mount(root, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        hung = [subprocess.Popen(["cat", str(mnt / "a" / "c" / c)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE) for c in ("5/1", "6/2", "7/3")]
        time.sleep(1)
        assert all(p.poll() is None for p in hung), "the stalled shard was not even read"
        same_as_original(mnt / "b", root / "b")
        same_as_original(mnt / "a", root / "a", "0:32, :")
        assert sorted(os.listdir(mnt / "a" / "c" / "0")) == ["0", "1", "2", "3", "4", "5", "6", "7"]
        kill()
        for p in hung:
            p.wait(timeout=30)
            assert p.returncode != 0 and b"Input/output error" in p.stderr.read()
        same_as_original(mnt / "b", root / "b")


@pytest.fixture(scope="module")
def reader_user():
    if subprocess.run(["id", READER], check=False, capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", READER],
                       check=True, capture_output=True)
    return READER


def as_user(user: str, *cmd, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *map(str, cmd)], check=False, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """A zarr-python store with a symlink loop, links to a root-only file outside the store,
    and files and shards of mode 0600 next to 0644 ones, in a directory every user may reach."""
    base = Path(tempfile.mkdtemp(prefix="zvfs-hostile-", dir="/tmp"))
    base.chmod(0o755)
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret").write_text("root only\n")
    (outside / "secret").chmod(0o600)
    root = base / "store.zarr"
    write_zarr_store(root)
    (root / "junk").mkdir()
    (root / "junk" / "note.txt").write_text("a note\n")
    (root / "junk" / "a").symlink_to(".")
    (root / "leak").symlink_to(outside / "secret")
    (root / "leakdir").symlink_to(outside)
    (root / "private.txt").write_text("private\n")
    (root / "private.txt").chmod(0o600)
    (root / "public.txt").write_text("public\n")
    (root / "public.txt").chmod(0o644)
    (root / "b" / "c" / "0" / "0").chmod(0o600)  # inner chunks 0-3 x 0-3 of b
    (root / "b" / "c" / "1" / "1").chmod(0o644)
    yield root
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False, timeout=60)


@contextlib.contextmanager
def public_mount(src: Path, *options: str):
    """A mount point other users can reach (pytest's temporary directories are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="zvfs-attacks-", dir="/tmp"))
    base.chmod(0o755)
    try:
        with zvfs_mount(src, base / "mnt", log=base / "zvfs.log", options=options) as mnt:
            yield mnt
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False, timeout=60)


@pytest.fixture(scope="module")
def hostile_mount(hostile_store, reader_user):
    with public_mount(hostile_store, "allow_other") as mnt:
        yield mnt


def test_find_and_cp_terminate_on_a_symlink_loop(hostile_mount, tmp_path):
    r = subprocess.run(["find", str(hostile_mount)], check=False, capture_output=True, timeout=60)
    paths = r.stdout.decode().splitlines()
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert str(hostile_mount / "junk" / "note.txt") in paths
    assert not [p for p in paths if "/junk/a" in p]
    assert len(paths) < 500  # 2 arrays of 64 chunks, a few files and directories
    r = subprocess.run(["cp", "-r", str(hostile_mount), str(tmp_path / "copy")], check=False, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert (tmp_path / "copy" / "junk" / "note.txt").read_text() == "a note\n"
    assert not (tmp_path / "copy" / "junk" / "a").exists()


def test_links_out_of_the_store_are_not_served(hostile_mount, hostile_store, reader_user):
    names = os.listdir(hostile_mount)
    assert "leak" not in names and "leakdir" not in names and "public.txt" in names
    for name in ("leak", "leakdir/secret"):
        assert not (hostile_mount / name).exists()
        r = as_user(reader_user, "cat", hostile_mount / name)
        assert r.returncode != 0 and b"root only" not in r.stdout
    assert as_user(reader_user, "cat", hostile_mount / "public.txt").stdout == b"public\n"


def test_follow_symlinks_serves_links_out_of_the_store(hostile_store):
    with public_mount(hostile_store, "follow_symlinks") as mnt:
        assert (mnt / "leak").read_text() == "root only\n"
        assert (mnt / "leakdir" / "secret").read_text() == "root only\n"


def test_allow_other_shows_modes_no_wider_than_the_store(hostile_mount, hostile_store, reader_user):
    """A file or shard of mode 0600 in the store stays root's through an allow_other mount;
    0644 ones stay readable by everyone."""
    assert as_user(reader_user, "cat", hostile_mount / "public.txt").stdout == b"public\n"
    public_chunk = as_user(reader_user, "cat", hostile_mount / "b" / "c" / "5" / "5")
    assert public_chunk.returncode == 0 and public_chunk.stdout == (hostile_mount / "b" / "c" / "5" / "5").read_bytes()
    for path in (hostile_mount / "private.txt", hostile_mount / "b" / "c" / "1" / "2"):
        r = as_user(reader_user, "cat", path)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (path, r)
    st = os.stat(hostile_mount / "private.txt")
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0
