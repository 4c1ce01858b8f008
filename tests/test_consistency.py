"""The consistency model (README, docs/reliability.md) through real mounts of local stores.

A chunk file read returns exactly the bytes of that chunk as stored before or after a change
of its shard, or EIO; never bytes of another chunk. The shards are rewritten by zarr-python
(the writer people use) into a second store, and the new shard bytes are put in place the way
writers do it: in place (truncate + write into the same file), or atomically (write a new file
and rename it over the old one), or the shard is deleted or truncated. Expected contents come
from zarr-python reading the old and new stores directly, never from zvfs.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import zvfs_mount

pytestmark = pytest.mark.mount

SHAPE, SHARD, INNER = (64, 64), (64, 64), (16, 16)  # one shard of 4 x 4 inner chunks


def _write(root: Path, data: np.ndarray) -> None:
    a = zarr.create_array(str(root), shape=SHAPE, shards=SHARD, chunks=INNER, dtype="uint16", fill_value=0,
                          compressors=None, overwrite=True)
    a[...] = data


def _stores(tmp_path: Path):
    """The mounted store (old data) and a store holding the new data, both by zarr-python.
    The update empties chunk (0, 0), so every other chunk moves inside the shard."""
    rng = np.random.default_rng(7)
    old = rng.integers(1, 60000, SHAPE, dtype=np.uint16)
    new = rng.integers(1, 60000, SHAPE, dtype=np.uint16)
    new[:16, :16] = 0
    src, upd = tmp_path / "store.zarr", tmp_path / "update.zarr"
    _write(src, old)
    _write(upd, new)
    return src, upd, old, new


def _chunk_bytes(arr: np.ndarray) -> dict[str, bytes]:
    """Uncompressed little-endian inner chunks by their unsharded key, from the array itself."""
    out = {}
    for i in range(SHAPE[0] // INNER[0]):
        for j in range(SHAPE[1] // INNER[1]):
            block = arr[i * 16:(i + 1) * 16, j * 16:(j + 1) * 16]
            if block.any():
                out[f"c/{i}/{j}"] = block.astype("<u2").tobytes()
    return out


def _read_each(mnt: Path) -> dict[str, bytes | int]:
    """Every chunk file's bytes, or the errno its open/read failed with."""
    out: dict[str, bytes | int] = {}
    for i in range(4):
        for j in range(4):
            try:
                out[f"c/{i}/{j}"] = (mnt / "c" / str(i) / str(j)).read_bytes()
            except OSError as e:
                out[f"c/{i}/{j}"] = e.errno
    return out


def _check_before_or_after(got: dict, before: dict, after: dict, allow_eio=True) -> None:
    for key, value in got.items():
        if isinstance(value, int):
            assert value in ((errno.ENOENT, errno.EIO) if allow_eio else (errno.ENOENT,)), f"{key}: errno {value}"
            if value == errno.ENOENT:
                assert key not in after, f"{key}: ENOENT but the new shard holds it"
            continue
        assert value in (before.get(key), after.get(key)), f"{key}: bytes of neither version ({len(value)} bytes)"


def _put_in_place(shard: Path, new_bytes: bytes) -> None:
    with open(shard, "r+b") as f:
        f.truncate(0)
        f.write(new_bytes)


def _put_atomically(shard: Path, new_bytes: bytes) -> None:
    tmp = shard.with_name(shard.name + ".tmp")
    tmp.write_bytes(new_bytes)
    os.replace(tmp, shard)


@pytest.mark.parametrize("how", ["in_place", "atomic"])
def test_a_rewritten_shard_reads_as_the_new_data(tmp_path, how):
    src, upd, old, new = _stores(tmp_path)
    shard = src / "c" / "0" / "0"
    new_bytes = (upd / "c" / "0" / "0").read_bytes()
    before, after = _chunk_bytes(old), _chunk_bytes(new)
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        assert (mnt / "c/1/1").read_bytes() == before["c/1/1"]  # the index is cached now
        assert os.stat(mnt / "c/0/0").st_size == len(before["c/0/0"])  # (the kernel holds its attributes)
        held = open(mnt / "c/2/2", "rb")  # opened before the change, read after it
        try:
            (_put_in_place if how == "in_place" else _put_atomically)(shard, new_bytes)
            try:
                got_held = held.read()
            except OSError as e:
                got_held = e.errno
            _check_before_or_after({"c/2/2": got_held}, before, after)
        finally:
            held.close()
        got = _read_each(mnt)
        assert got == {k: after.get(k, errno.ENOENT) for k in got}, "a fresh open must see the new shard"
        with pytest.raises(FileNotFoundError):  # the open found it gone: so does a stat by its path
            os.stat(mnt / "c/0/0")
        np.testing.assert_array_equal(zarr.open_array(str(mnt))[...], new)


def test_atomic_replace_after_the_descriptor_cache_turned_over(tmp_path):
    """More shards than the local store keeps descriptors for: the old descriptor is gone by
    the time the shard is replaced, so only the path's identity can tell."""
    rng = np.random.default_rng(3)
    shape = (16 * 300, 16)
    old = rng.integers(1, 60000, shape, dtype=np.uint16)
    new = old.copy()
    new[:16] = 0  # empties chunk (0, 0): chunk (1, 0) moves inside shard 0
    new[16:32] += 1
    src, upd = tmp_path / "store.zarr", tmp_path / "update.zarr"
    for root, data in ((src, old), (upd, new)):
        a = zarr.create_array(str(root), shape=shape, shards=(32, 16), chunks=(16, 16), dtype="uint16",
                              fill_value=0, compressors=None, overwrite=True)
        a[...] = data
    with zvfs_mount(src, tmp_path / "mnt") as mnt:
        assert (mnt / "c/1/0").read_bytes() == old[16:32].astype("<u2").tobytes()
        for i in range(2, 300):  # 149 other shards: turns the descriptor cache over
            (mnt / f"c/{i}/0").read_bytes()
        _put_atomically(src / "c/0/0", (upd / "c/0/0").read_bytes())
        assert (mnt / "c/1/0").read_bytes() == new[16:32].astype("<u2").tobytes()
        with pytest.raises(FileNotFoundError):
            (mnt / "c/0/0").read_bytes()


def test_a_deleted_shard_reads_as_missing_and_a_truncated_one_never_as_other_bytes(tmp_path):
    src, upd, old, new = _stores(tmp_path)
    before = _chunk_bytes(old)
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        assert _read_each(mnt) == before
        shard = src / "c/0/0"
        data = shard.read_bytes()
        with open(shard, "r+b") as f:
            f.truncate(len(data) // 2)
        got = _read_each(mnt)
        _check_before_or_after(got, before, {})
        assert any(v == errno.EIO for v in got.values()), "a shard cut in half has no readable index"
        shard.unlink()
        got = _read_each(mnt)
        assert set(got.values()) == {errno.ENOENT}, got
        np.testing.assert_array_equal(zarr.open_array(str(mnt))[...], np.zeros(SHAPE, np.uint16))


def test_a_new_shard_appears_after_refresh(tmp_path):
    src, upd, old, new = _stores(tmp_path)
    shutil.rmtree(src / "c")
    with zvfs_mount(src, tmp_path / "mnt") as mnt:
        assert not (mnt / "c").exists() or os.listdir(mnt / "c") == []
        shutil.copytree(upd / "c", src / "c")
        assert b'"refreshed": true' in (mnt / ".zvfs.refresh").read_bytes()
        assert sorted(os.listdir(mnt / "c" / "1")) == ["0", "1", "2", "3"]
        np.testing.assert_array_equal(zarr.open_array(str(mnt))[...], new)


def test_an_index_entry_past_the_end_of_the_shard_is_eio_never_a_huge_file(tmp_path):
    """A lying index (crc32c correct) claiming 2**40 bytes of a small shard: that chunk is EIO
    (and not listed); Python's open().read() must not see an st_size of 2**40."""
    import crc32c

    src, _, old, _ = _stores(tmp_path)
    shard = src / "c/0/0"
    raw = bytearray(shard.read_bytes())
    n = 16  # inner chunks in the shard; index at the end: 16 x (offset, nbytes) + crc32c
    index = np.frombuffer(bytes(raw[-(16 * n + 4):-4]), dtype="<u8").reshape(n, 2).copy()
    index[1] = (0, 2**40)  # chunk (0, 1)
    body = index.tobytes()
    raw[-(16 * n + 4):] = body + crc32c.crc32c(body).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    before = _chunk_bytes(old)
    with zvfs_mount(src, tmp_path / "mnt") as mnt:
        with pytest.raises(OSError) as e:
            (mnt / "c/0/1").read_bytes()
        assert e.value.errno == errno.EIO
        assert "1" not in os.listdir(mnt / "c/0")
        assert (mnt / "c/0/2").read_bytes() == before["c/0/2"]  # the rest of the shard is fine


def test_a_chunk_files_stat_sees_its_shard_rewritten_within_a_tenth_of_its_age(tmp_path):
    """The kernel keeps a chunk file's attributes a tenth of its shard's age (1 s to 60 s), not
    the entries' 24 h: a `stat` by path after the shard was rewritten, by rename or in place,
    showed the old mtime until the file was opened or its directory listed (an outside
    attacker: 18 of 18 rewrites still unseen after 8 s; `cp -u FILE` kept its old copy). Here
    the shard is 20 s old when first seen (2 s), then a fresh one (1 s); the file's attributes
    come from a lookup, then from a listing."""
    src, upd, _, _ = _stores(tmp_path)
    shard, aged = src / "c/0/0", time.time_ns() - 20 * 10**9
    os.utime(shard, ns=(aged, aged))
    with zvfs_mount(src, tmp_path / "mnt") as mnt:
        for name, how in (("c/0/1", "rename"), ("c/0/2", "in place")):
            if name == "c/0/2":
                assert {e.name for e in os.scandir(mnt / "c/0")} >= {"1", "2"}  # (attributes from the listing)
            before = (mnt / name).stat().st_mtime_ns
            assert before == shard.stat().st_mtime_ns
            time.sleep(0.3)
            assert (mnt / name).stat().st_mtime_ns == before  # (kept by the kernel meanwhile)
            if how == "rename":
                (src / "c/0/0.tmp").write_bytes((upd / "c/0/0").read_bytes())
                os.replace(src / "c/0/0.tmp", shard)
            else:
                with open(shard, "r+b") as f:
                    f.write(f.read())
            now = shard.stat().st_mtime_ns
            assert now != before
            t = time.monotonic()
            while (mnt / name).stat().st_mtime_ns != now:
                assert time.monotonic() - t < 5, f"{name}: the mtime before the {how} rewrite still shown after 5 s"
                time.sleep(0.05)


def test_a_name_given_an_alias_stats_as_its_shard_is_now(tmp_path):
    """A chunk file opened while a handle read an older version gets an inode number of its own
    for the newer one (an alias, fuse_kernel.py), which the kernel keeps for the name 24 h. Once
    no handle reads it, its `stat` must follow the shard as a tree inode's does: it answered the
    alias's version for good, until an open (a second outside attacker: after 20 s of churn,
    `stat` of some chunk files kept an in-place rewrite's old mtime for 75 s and more)."""
    src, upd, _, _ = _stores(tmp_path)
    shard = src / "c/0/0"
    aged = time.time_ns() - 20 * 10**9
    os.utime(shard, ns=(aged, aged))
    with zvfs_mount(src, tmp_path / "mnt") as mnt:
        path = mnt / "c/0/1"
        held = open(path, "rb")  # (a handle of the first version)
        held.read(10)
        (src / "c/0/0.tmp").write_bytes((upd / "c/0/0").read_bytes())
        os.replace(src / "c/0/0.tmp", shard)
        with open(path, "rb") as second:  # (ESTALE, the name looked up again: an alias)
            second.read()
        alias = path.stat().st_ino
        held.close()
        time.sleep(0.2)
        with open(shard, "r+b") as f:  # a third version, in place
            f.write(f.read())
        now = shard.stat().st_mtime_ns
        t = time.monotonic()
        while (st := path.stat()).st_mtime_ns != now:
            assert time.monotonic() - t < 5, f"the alias {alias} (now {st.st_ino}) still shows an older version after 5 s"
            time.sleep(0.05)


def test_times_and_modes_come_from_the_store(tmp_path):
    """Chunk files carry their shard's mtime and (read-only) mode, rewritten metadata the
    mtime of the file it was rewritten from, files and directories shown as stored their own,
    to the nanosecond (make, `cp -u` and `find -newer` compare nanoseconds): rsync and make see
    nothing changed after a remount, and nothing is more readable through the mount than in
    the store."""
    base = Path(tempfile.mkdtemp(prefix="zvfs-modes-"))  # every reader may reach it (pytest's own are 0700)
    base.chmod(0o755)
    src, _, old, _ = _stores(base)
    shard, meta = src / "c/0/0", src / "zarr.json"
    shard_ns, meta_ns = 1_600_000_000_123_456_789, 1_500_000_000_987_654_321
    os.utime(shard, ns=(shard_ns, shard_ns))
    os.utime(meta, ns=(meta_ns, meta_ns))
    group = base / "group.zarr"  # (files and directories shown as stored: beside a group's arrays)
    zarr.open_group(group, mode="w")
    (group / "notes").mkdir()
    (group / "notes" / "README.txt").write_text("x")
    os.utime(group / "notes" / "README.txt", ns=(1, 1_400_000_000_000_000_777))
    os.utime(group / "notes", ns=(1, 1_300_000_000_000_000_333))
    shard.chmod(0o640)
    src.chmod(0o750)
    for _ in range(2):  # the same after a remount
        with zvfs_mount(src, tmp_path / "mnt") as mnt:
            listed = {e.name: e.stat() for e in os.scandir(mnt / "c/0")}  # attributes from the listing
            for st in [*listed.values(), (mnt / "c/1/1").stat()]:
                assert st.st_mtime_ns == shard_ns
                assert st.st_mode & 0o777 == 0o440
            assert (mnt / "zarr.json").stat().st_mtime_ns == meta_ns
            assert (mnt / "c").stat().st_mode & 0o777 == 0o550
        with zvfs_mount(group, tmp_path / "mnt") as mnt:
            assert (mnt / "notes" / "README.txt").stat().st_mtime_ns == 1_400_000_000_000_000_777
            assert (mnt / "notes").stat().st_mtime_ns == 1_300_000_000_000_000_333
            assert (mnt / "zarr.json").stat().st_mtime_ns == (group / "zarr.json").stat().st_mtime_ns
    shutil.rmtree(base)
