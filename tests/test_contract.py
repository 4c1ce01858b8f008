"""Each promise of the contract (docs/reliability.md) through real mounts, in the form an
attacker broke it before (issue 22): an open file that served old then new bytes, fresh opens
that mixed the kernel's old pages with new bytes, a name that served another file, one bad
shard that emptied a listing, control files any user could open.

Stores are written by zarr-python; expected bytes come from zarr-python's unsharded writes of
the same data (the chunk files are the inner chunks' bytes), never from zvfs.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import as_reader, zvfs_mount

pytestmark = pytest.mark.mount

CHUNK = (2048, 2048)  # uint8: one 4 MiB chunk file, read in many kernel requests


def _write(root: Path, data: np.ndarray, shards=(4096, 2048), chunks=CHUNK) -> None:
    zarr.create_array(str(root), shape=data.shape, shards=shards, chunks=chunks, dtype=data.dtype,
                      fill_value=0, compressors=None, overwrite=True)[...] = data


def _versions(tmp_path: Path):
    """A store of two 4 MiB chunks in one shard, and the shard's bytes after a rewrite that
    changes both (same layout: only the bytes differ)."""
    tmp_path.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    old = rng.integers(1, 255, (4096, 2048), dtype=np.uint8)
    new = rng.integers(1, 255, (4096, 2048), dtype=np.uint8)
    src, upd = tmp_path / "store.zarr", tmp_path / "update.zarr"
    _write(src, old)
    _write(upd, new)
    return src, (upd / "c/0/0").read_bytes(), old[:2048].tobytes(), new[:2048].tobytes()


def _in_place(shard: Path, data: bytes, keep_mtime: bool = False) -> None:
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.write(data)
        f.truncate()
    if keep_mtime:  # `touch -r`: the writer puts the old mtime back
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def _by_rename(shard: Path, data: bytes) -> None:
    tmp = shard.with_name(shard.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, shard)


@pytest.mark.parametrize("how", ["in_place", "in_place_keep_mtime", "rename"])
def test_an_open_file_reads_one_version(tmp_path, how):
    """Read 1 MiB, rewrite the shard, read the rest through the same handle: all of it the old
    version (a replaced file stays readable through its handle), or EIO (rewritten in place),
    never 1 MiB old and 3 MiB new. With and without the kernel's read-ahead of the rest."""
    src, new_shard, old, new = _versions(tmp_path)
    with zvfs_mount(src, tmp_path / "mnt", options=["readahead=0"]) as mnt:
        with open(mnt / "c/0/0", "rb", buffering=0) as f:
            first = f.read(1 << 20)
            if how == "rename":
                _by_rename(src / "c/0/0", new_shard)
            else:
                _in_place(src / "c/0/0", new_shard, keep_mtime=how.endswith("keep_mtime"))
            try:
                rest = f.read()
            except OSError as e:
                assert e.errno == errno.EIO and how != "rename", f"{how}: {e!r}"
                rest = None
        assert first == old[: 1 << 20]
        if rest is not None:
            assert first + rest == old, f"{how}: one handle served two versions"
        assert (mnt / "c/0/0").read_bytes() == new, "a fresh open sees the new version"


@pytest.mark.parametrize("how", ["in_place_keep_mtime", "in_place", "rename"])
def test_a_fresh_open_never_mixes_old_pages_with_new_bytes(tmp_path, how):
    """The kernel holds part of a file's pages; the shard is rewritten; 5,000 lookups of other
    files of the mount push the node out of every table of recent nodes (it is rebuilt from
    its inode number); a fresh open must read the new version whole."""
    src, new_shard, old, new = _versions(tmp_path / "a")
    group = tmp_path / "store"
    zarr.create_group(str(group))
    shutil.move(src, group / "a")
    _write(group / "m", np.ones((1, 5000), np.uint8), shards=(1, 5000), chunks=(1, 1))
    shard = group / "a/c/0/0"
    with zvfs_mount(group, tmp_path / "mnt") as mnt:
        with open(mnt / "a/c/0/0", "rb") as f:
            assert f.read(1 << 18) == old[: 1 << 18]  # (and the kernel's read-ahead after it)
        if how == "rename":
            _by_rename(shard, new_shard)
        else:
            _in_place(shard, new_shard, keep_mtime=how.endswith("keep_mtime"))
        for j in range(5000):
            os.stat(mnt / f"m/c/0/{j}")
        assert (mnt / "a/c/0/0").read_bytes() == new


def test_a_name_never_serves_another_file(tmp_path):
    """Files shown as stored were numbered by their place in the listing: after a file before
    them went away and another came, and the listing was evicted, a name the kernel still held
    served its neighbour's bytes. Numbers are never reused for another name."""
    src = tmp_path / "store.zarr"
    zarr.create_group(str(src))
    misc = src / "misc"
    misc.mkdir()
    for i in range(100):
        (misc / f"f{i:03d}").write_text(f"file {i:03d}\n" * (i + 1))
    bulk = src / "bulk"  # lists to evict the small listing cache
    bulk.mkdir()
    for i in range(3000):
        (bulk / f"b{i:05d}-{'x' * 40}").write_bytes(b"")
    with zvfs_mount(src, tmp_path / "mnt", options=["index_cache=64K"]) as mnt:
        assert len(os.listdir(mnt / "misc")) == 100
        before = {i: (mnt / "misc" / f"f{i:03d}").read_text() for i in (50, 99)}
        (misc / "f000").unlink()
        (misc / "f100").write_text("file 100\n")
        (misc / "a000").write_text("new first\n")
        assert len(os.listdir(mnt / "bulk")) == 3000  # the listing of misc is evicted
        for i in (50, 99):
            assert (mnt / "misc" / f"f{i:03d}").read_text() == before[i] == (misc / f"f{i:03d}").read_text()
        assert (mnt / "misc" / "f100").read_text() == "file 100\n"
        assert (mnt / "misc" / "a000").read_text() == "new first\n"
        with pytest.raises(FileNotFoundError):  # (its stat may still come from the kernel's cache)
            (mnt / "misc" / "f000").read_text()
        assert sorted(os.listdir(mnt / "misc")) == sorted(os.listdir(misc))


def _bad_shard(shard: Path, kind: str, outside: Path) -> None:
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    elif kind == "dev_zero":
        shard.symlink_to("/dev/zero")
    elif kind == "outside":
        shard.symlink_to(outside)
    elif kind == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(shard))
        s.close()


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "outside", "socket"])
def test_one_bad_shard_costs_only_its_own_files(tmp_path, kind):
    """Ten shards of 900 chunk files; one is a FIFO, a device, a socket or a symlink leading out
    of the store: its files are EIO (by name) and absent from listings, with one log line and
    no traceback; the other 8,100 files list and read."""
    src = tmp_path / "store.zarr"
    data = (np.arange(10 * 30 * 30, dtype=np.uint32).reshape(10, 30, 30) % 251 + 1).astype(np.uint8)
    zarr.create_array(str(src), shape=(10, 30, 30), shards=(1, 30, 30), chunks=(1, 1, 1), dtype="uint8",
                      fill_value=0, compressors=None)[...] = data
    outside = tmp_path / "secret"
    outside.write_bytes((src / "c/3/0/0").read_bytes())  # a well-formed shard, outside the store
    _bad_shard(src / "c/3/0/0", kind, outside)
    log = tmp_path / "zvfs.log"
    with zvfs_mount(src, tmp_path / "mnt", log=log) as mnt:
        found = subprocess.run(["find", str(mnt), "-type", "f"], capture_output=True, text=True, timeout=120)
        chunks = [line for line in found.stdout.splitlines() if "/c/" in line]
        assert found.returncode == 0, found.stderr
        assert len(chunks) == 9 * 900
        assert sorted(os.listdir(mnt / "c"), key=int) == [str(i) for i in range(10) if i != 3]
        with pytest.raises(OSError) as e:
            (mnt / "c/3/0/0").read_bytes()
        assert e.value.errno == errno.EIO
        assert (mnt / "c/4/29/29").read_bytes() == bytes([data[4, 29, 29]])
    text = log.read_text()
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    assert sum("c/3/0/0" in line for line in text.splitlines()) == 1, text[-2000:]


def test_control_files_answer_the_owner_and_root_only(tmp_path, reader):
    base = Path(tempfile.mkdtemp(prefix="zvfs-control-"))
    try:
        base.chmod(0o755)
        src = base / "store.zarr"
        _write(src, np.ones((8, 8), np.uint8), shards=(8, 8), chunks=(4, 4))
        (base / "mnt").mkdir()
        with zvfs_mount(src, base / "mnt", options=["allow_other"]) as mnt:
            for name in (".zvfs.refresh", ".zvfs.stats"):
                r = as_reader("cat", mnt / name)
                assert r.returncode != 0 and b"ermission denied" in r.stderr, (name, r)
            assert b'"refreshed": true' in (mnt / ".zvfs.refresh").read_bytes()  # root may
            r = as_reader("cat", mnt / "c/0/0")
            assert r.returncode == 0 and r.stdout == (mnt / "c/0/0").read_bytes()
    finally:
        shutil.rmtree(base)
