"""A mount that would read itself or hide files is refused (one line, exit 2, nothing mounted),
by `zvfs mount` and by the daemon itself (`--foreground`, as systemd runs it): a mount point
that is the source, inside it or above it (symlinks resolved), or that holds files unless
`-o nonempty`. Mount points other file systems answer for are judged from the mount table
alone: a FUSE mount whose daemon is stopped is never asked, an automount point never triggered.

Before these checks `zvfs mount S S` returned 0 and `ls S` hung in D state for good, so this
file never stats what it mounts and clears its own mounts by aborting their FUSE connections
(/sys/fs/fuse/connections), which ends even a mount that deadlocked on itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_zvfs, zvfs_mount
from test_cli import _one_line
from test_cli_surface import _autofs

import zvfs
from zvfs.fronts.mounting import check_mountpoint
from zvfs.options import MountOptions

pytestmark = pytest.mark.mount

REPO = Path(__file__).resolve().parents[1]
#: a command that must refuse returns at once; one that hangs on what it should not touch fails
QUICK = 30


def _fuse_mounts_under(base: Path) -> list[tuple[str, int]]:
    """(mount point, FUSE connection number) of the FUSE mounts at or under `base`, topmost
    last, from the mount table (never a stat)."""
    base_s = os.path.realpath(base)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            point = fields[4].replace("\\040", " ")
            if fields[sep + 1].startswith("fuse") and (point == base_s or point.startswith(base_s + "/")):
                out.append((point, int(fields[2].split(":")[1])))
    return out


def _release(base: Path) -> None:
    """Abort and lazily unmount every FUSE mount under `base` (a self-deadlocked one included)."""
    for point, conn in reversed(_fuse_mounts_under(base)):
        try:
            Path(f"/sys/fs/fuse/connections/{conn}/abort").write_text("1")
        except OSError:
            pass
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


@pytest.fixture
def store(tmp_path):
    """A copy of the sample store with an empty directory inside (a mount point in the source)."""
    src = tmp_path / "s.zarr"
    shutil.copytree(zvfs.SAMPLE_STORE, src)
    (src / "sub").mkdir()
    try:
        yield src
    finally:
        _release(tmp_path)


RECURSING = {  # case -> (source, mount point), relative to the test's directory; words of the refusal
    "the source itself": ("s.zarr", "s.zarr", "is the source"),
    "inside the source": ("s.zarr", "s.zarr/sub", "is inside the source"),
    "above the source": ("s.zarr", ".", "is above the source"),
    "a symlink to the source": ("s.zarr", "link", "is the source"),
    "inside a file:// source": ("file://{base}/s.zarr", "s.zarr/sub", "is inside the source"),
    "the source through a symlink": ("link", "s.zarr", "is the source"),
}


@pytest.mark.parametrize("foreground", [False, True], ids=["mount", "daemon"])
@pytest.mark.parametrize("case", RECURSING)
def test_a_mount_that_would_read_itself_is_refused(store, case, foreground):
    base = store.parent
    (base / "link").symlink_to(store)
    source, point, words = RECURSING[case]
    source = source.format(base=base) if "://" in source else str(base / source)
    args = ["mount", source, base / point] + (["--foreground"] if foreground else [])
    try:
        r = run_zvfs(*args, timeout=QUICK)
    except subprocess.TimeoutExpired:
        pytest.fail(f"zvfs {' '.join(map(str, args))} did not return (it mounted, and serves itself)")
    mounted = _fuse_mounts_under(base)
    assert r.returncode == 2, (r.returncode, r.stderr)
    msg = _one_line(r.stderr)
    assert words in msg and str(store) in msg and "would read itself" in msg, msg
    assert not mounted, f"mounted anyway: {mounted}"


BOUND = {  # case -> (source, mount point) relative to the test's directory; words of the refusal
    "inside the source reached through a bind mount": ("bound", "s.zarr/sub", "is inside the source"),
    "the source reached through a bind mount": ("bound", "s.zarr", "is the source"),
    "above the source reached through a bind mount": ("bound-base/s.zarr", ".", "is above the source"),
    "inside a bind of a directory inside the source": ("s.zarr", "sub-bound/x", "is inside the source"),
    "a bind of a directory above the source": ("s.zarr", "bound-base", "is above the source"),
}


@pytest.mark.parametrize("case", BOUND)
def test_a_mount_that_would_read_itself_through_a_bind_mount_is_refused(store, case):
    """The source reached through a bind mount (`bound` of s.zarr, `bound-base` of the test's
    directory, `sub-bound` of a directory inside s.zarr), shared as systemd makes mounts: a
    mount point inside, at or above it by another path. (Outside attackers' were accepted:
    they propagated inside their own source, and `find` went 265 levels deep.)"""
    base = store.parent
    source, point, words = BOUND[case]
    (store / "sub" / "x").mkdir()
    binds = [(store, base / "bound"), (base, base.parent / f"{base.name}-bound-base"), (store / "sub", base / "sub-bound")]
    try:
        for what, where in binds:
            where.mkdir()
            subprocess.run(["mount", "--bind", what, where], check=True, capture_output=True)
            subprocess.run(["mount", "--make-shared", where], check=True, capture_output=True)
        (base / "bound-base").symlink_to(binds[1][1])
        try:
            r = run_zvfs("mount", base / source, base / point, timeout=QUICK)
        except subprocess.TimeoutExpired:
            pytest.fail(f"zvfs mount {source} {point} did not return (it mounted, and serves itself)")
        mounted = _fuse_mounts_under(base) + _fuse_mounts_under(binds[1][1])
    finally:
        _release(base)
        _release(binds[1][1])
        for _, where in reversed(binds):
            subprocess.run(["umount", "-l", where], capture_output=True)
            where.rmdir()
    assert r.returncode == 2, (r.returncode, r.stderr)
    msg = _one_line(r.stderr)
    assert words in msg and "would read itself" in msg, msg
    assert not mounted, f"mounted anyway: {mounted}"


def test_a_mount_point_that_holds_files_is_refused_unless_nonempty(store, tmp_path):
    point = tmp_path / "full"
    point.mkdir()
    (point / "keep.txt").write_text("mine")
    for args in (["mount", store, point], ["mount", "--foreground", store, point]):
        try:
            r = run_zvfs(*args, timeout=QUICK)
        except subprocess.TimeoutExpired:
            pytest.fail("zvfs mount --foreground mounted over a directory that holds files")
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        msg = _one_line(r.stderr)
        assert "not empty" in msg and "keep.txt" in msg and "-o nonempty" in msg, msg
        assert not _fuse_mounts_under(point)
    with zvfs_mount(store, point, options=["nonempty"]) as mnt:
        assert sorted(os.listdir(mnt)) == ["labels", "raw", "sub", "zarr.json"]  # the store, keep.txt hidden
    assert (point / "keep.txt").read_text() == "mine"


def test_an_empty_mount_point_and_a_sibling_of_the_source_mount(store, tmp_path):
    """The checks refuse only what they should: a directory beside the source (sharing its name
    as a prefix, not a path) mounts."""
    point = tmp_path / "s.zarr-view"
    with zvfs_mount(store, point) as mnt:
        assert sorted(os.listdir(mnt)) == ["labels", "raw", "sub", "zarr.json"]


@pytest.fixture
def stopped_fuse(tmp_path):
    """A FUSE file system (scripts/floorfs.py) mounted on a directory, its daemon stopped: any
    request to it (a stat, a listing) would wait until the daemon goes on."""
    backing, table, point = tmp_path / "backing", tmp_path / "table", tmp_path / "fuse"
    backing.write_bytes(b"hello")
    table.write_text("hello.txt\t0\t5\n")
    point.mkdir()
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "floorfs.py"), str(backing), str(table), str(point)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGSTOP)
        yield point
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(30)
        _release(tmp_path)


def test_another_fuse_mount_is_refused_without_asking_it(store, stopped_fuse):
    try:
        r = run_zvfs("mount", store, stopped_fuse, timeout=QUICK)
    except subprocess.TimeoutExpired:
        pytest.fail("zvfs mount asked the FUSE file system mounted on the mount point (its daemon is stopped)")
    assert r.returncode == 2, (r.returncode, r.stderr)
    msg = _one_line(r.stderr)
    assert "floorfs" in msg and "would be hidden" in msg and "-o nonempty" in msg, msg


def test_an_automount_point_is_judged_from_the_mount_table(store, tmp_path):
    """The check the daemon runs, on a real autofs mount point: it passes (systemd's automount is
    what runs zvfs there) and sends no automount request."""
    point = tmp_path / "auto"
    point.mkdir()
    with _autofs(point) as r:
        check_mountpoint(str(point), str(store), MountOptions())
        with pytest.raises(BlockingIOError):
            os.read(r, 4096)  # no automount request was sent
