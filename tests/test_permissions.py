"""Ownership and permissions through real mounts, read by a real non-root user (issue 12,
point 4; issue 10, point 10).

The store is written by zarr-python as root; one shard is then closed to others (0600), the
other stays 0644. Without options a mount shows the store's own read bits, never wider; an
administrator shares on purpose with `umask=` or hands the files to a user with `uid=`;
`allow_root` lets root in but nobody else; without `allow_other` other users see nothing.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import READER, as_reader, zvfs_mount

pytestmark = pytest.mark.mount

@pytest.fixture(scope="module")
def base():
    """A directory every user can traverse (pytest's own are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="zvfs-perm-"))
    path.chmod(0o755)
    src = path / "store.zarr"
    a = zarr.create_array(str(src), shape=(32, 16), shards=(16, 16), chunks=(8, 8), dtype="uint8",
                          fill_value=0, compressors=None)
    a[...] = np.arange(32 * 16, dtype=np.uint16).reshape(32, 16).astype(np.uint8)
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (src / "c/0/0").chmod(0o600)  # closed to others: its chunks c/0/0, c/0/1, c/1/0, c/1/1
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mount(base: Path, name: str, options):
    mnt = base / name
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    return zvfs_mount(base / "store.zarr", mnt, options=options)


def test_modes_are_never_wider_than_the_store(base, reader):
    with _mount(base, "plain", ["allow_other"]) as mnt:
        closed, open_ = mnt / "c/0/0", mnt / "c/2/0"
        assert closed.stat().st_mode & 0o777 == 0o400 and open_.stat().st_mode & 0o777 == 0o444
        assert as_reader("cat", closed).returncode != 0, "a chunk of a 0600 shard must stay closed to others"
        r = as_reader("cat", open_)
        assert r.returncode == 0 and r.stdout == open_.read_bytes()


def test_umask_shares_a_closed_store_on_purpose(base, reader):
    with _mount(base, "umask", ["allow_other", "umask=022"]) as mnt:
        closed = mnt / "c/0/0"
        assert closed.stat().st_mode & 0o777 == 0o444
        assert (mnt / "c").stat().st_mode & 0o777 == 0o555
        r = as_reader("cat", closed)
        assert r.returncode == 0 and r.stdout == closed.read_bytes()


def test_uid_and_gid_hand_the_files_to_a_user(base, reader):
    with _mount(base, "uid", ["allow_other", f"uid={READER}", "gid=0"]) as mnt:
        st = (mnt / "c/0/0").stat()
        assert (st.st_uid, st.st_gid) == (reader, 0)
        r = as_reader("cat", mnt / "c/0/0")  # 0400, and the reader owns it now
        assert r.returncode == 0 and r.stdout == (mnt / "c/0/0").read_bytes()
        assert as_reader("touch", mnt / "c/0/0").returncode != 0  # never a write bit


def test_allow_root_lets_root_in_and_nobody_else(base, reader):
    with _mount(base, "root", ["allow_root"]) as mnt:
        assert sorted(p.name for p in mnt.iterdir()) == ["c", "zarr.json"]
        r = as_reader("ls", mnt)
        assert r.returncode != 0 and b"ermission denied" in r.stderr
    with _mount(base, "private", []) as mnt:
        assert as_reader("ls", mnt).returncode != 0


@pytest.fixture(scope="module")
def closed_store():
    """Arrays behind a 0700 group, in a 0700 array directory, with a 0700 `c/`, and with a 0700
    shard row directory (`c/0/`), beside an open one; files 0644 everywhere."""
    path = Path(tempfile.mkdtemp(prefix="zvfs-closed-"))
    path.chmod(0o755)
    src = path / "store.zarr"
    root = zarr.open_group(str(src), mode="w", zarr_format=3)
    data = np.arange(32 * 32, dtype=np.uint16).reshape(32, 32).astype(np.uint8) + 1
    for name in ("open/a", "private/b", "locked_array", "locked_c", "locked_row"):
        parent, _, leaf = name.rpartition("/")
        group = root.require_group(parent) if parent else root
        group.create_array(leaf, shape=(32, 32), shards=(16, 16), chunks=(8, 8), dtype="uint8", fill_value=0,
                           compressors=None, dimension_names=["y", "x"])[...] = data
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for closed in ("private", "locked_array", "locked_c/c", "locked_row/c/0"):
        (src / closed).chmod(0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_a_reader_reads_through_the_mount_exactly_what_the_store_lets_them(closed_store, reader, view):
    """Through an allow_other mount, another user reads every file under the open array and
    none under a 0700 directory at any level (group, array, `c/`, a shard's row directory),
    in every view; root reads them all. (Before: directories showed 0555 whatever the store
    said, and only 0600 files stayed closed.)"""
    mnt = closed_store / f"mnt-{view}"
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    with zvfs_mount(closed_store / "store.zarr", mnt, options=["allow_other", f"view={view}"]):
        files = {top: sorted(p for p in (mnt / top).rglob("*") if p.is_file())
                 for top in ("open", "private", "locked_array", "locked_c", "locked_row")}
        for top, found in files.items():
            assert found, f"{view}: root sees no files under {top}"
            chunks = [p for p in found if p.name not in ("zarr.json", ".zarray", ".zattrs", ".zgroup", "attributes.json")]
            assert chunks, f"{view}: no chunk files under {top}"
            readable = [p for p in found if as_reader("cat", p).returncode == 0]
            if top == "open":
                assert readable == found, f"{view}: the reader cannot read {sorted(set(found) - set(readable))[:3]}"
            elif top == "locked_c":  # the metadata beside `c/` is open in the store too
                assert readable == [p for p in found if p not in chunks], (view, readable[:3])
            elif top == "locked_row":  # only the chunks of the shards in c/0/ are closed
                closed = [p for p in chunks if p not in readable]
                assert closed and all(p in readable for p in found if p not in chunks), (view, closed[:3])
                assert len(closed) == 8, f"{view}: {len(closed)} chunk files closed, expected the 8 of the c/0/ shards"
            else:
                assert not readable, f"{view}: the reader reads {readable[:3]} under the closed {top}"
