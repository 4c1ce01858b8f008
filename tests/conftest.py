"""Shared fixtures: fixture stores (written once per session), real zvfs mounts, cleanup.

Every mount goes through ``zvfs_mount`` which always unmounts in a ``finally`` (``zvfs umount``,
then ``fusermount3 -uz`` as a fallback); a session-end check fails the run if any FUSE mount is
left under the test's temporary directories.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import writers  # noqa: E402
import zarr_reference  # noqa: E402

ZVFS = [sys.executable, "-m", "zvfs"]
#: Test data kept in the repository (each set with its README: source and license).
DATA = Path(__file__).resolve().parent / "data"
ZARRITA = DATA / "zarrita-v3" / "data.zarr"
MOUNT_TIMEOUT = 60


def pytest_configure(config):
    # zarr-python warns about sharding+transpose and friends on every open; keep output readable
    warnings.filterwarnings("ignore", module="zarr")
    config.addinivalue_line("markers", "mount: test uses a real FUSE mount")


# ----------------------------------------------------------------------------------------------
# running zvfs


def run_zvfs(*args, timeout=MOUNT_TIMEOUT, input=None, workdir=None) -> subprocess.CompletedProcess:
    """Run ``python -m zvfs ARGS``; output goes through files, never pipes.

    A daemonizing ``zvfs mount`` that keeps inherited pipes open would otherwise hang the test.
    """
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.run([*ZVFS, *map(str, args)], stdout=out, stderr=err, timeout=timeout,
                           stdin=subprocess.DEVNULL, cwd=workdir)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read())


def fuse_mounts_under(base: str | os.PathLike) -> list[str]:
    base = os.path.realpath(base)
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            mnt = parts[1].replace("\\040", " ")
            if parts[2].startswith("fuse") and (mnt == base or mnt.startswith(base + os.sep)):
                out.append(mnt)
    return out


def is_mounted(mnt: str | os.PathLike) -> bool:
    """os.path.ismount, or listed in /proc/mounts (a dead FUSE mount fails ismount's stat)."""
    try:
        if os.path.ismount(mnt):
            return True
    except OSError:
        pass
    real = os.path.realpath(mnt)
    with open("/proc/mounts") as f:
        return any(line.split()[1].replace("\\040", " ") == real for line in f if line.strip())


def force_unmount(mnt: str | os.PathLike) -> None:
    for cmd in (["fusermount3", "-uz", str(mnt)], ["umount", "-l", str(mnt)]):
        if not is_mounted(mnt):
            return
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)


def unmount(mnt: str | os.PathLike) -> str | None:
    """Unmount with ``zvfs umount``; fall back to fusermount3. Returns a problem text or None."""
    problem = None
    try:
        r = run_zvfs("umount", mnt, timeout=30)
        if r.returncode != 0:
            problem = f"zvfs umount exited {r.returncode}: {r.stderr.decode(errors='replace').strip()}"
        elif is_mounted(mnt):
            problem = "zvfs umount exited 0 but the mount is still there"
    except subprocess.TimeoutExpired:
        problem = "zvfs umount timed out"
    finally:
        force_unmount(mnt)
    return problem


@contextlib.contextmanager
def zvfs_mount(src, mnt, log=None, options=(), extra_args=()):
    """Mount SRC on MNT with zvfs (``-o log=LOG`` plus options), yield MNT, always unmount."""
    mnt = Path(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    opts = list(options)
    if log is not None:
        opts.insert(0, f"log={log}")
    args = ["mount", src, mnt, *extra_args]
    if opts:
        args += ["-o", ",".join(opts)]
    problem = None
    try:
        try:
            r = run_zvfs(*args)
        except subprocess.TimeoutExpired:
            pytest.fail(f"zvfs mount {src} did not return within {MOUNT_TIMEOUT}s")
        assert r.returncode == 0, (
            f"zvfs mount {src} exited {r.returncode}: {r.stderr.decode(errors='replace').strip()}"
            + (f"\nlog:\n{Path(log).read_text(errors='replace')[-3000:]}"
               if log and Path(log).exists() else ""))
        assert os.path.ismount(mnt), "zvfs mount exited 0 but the mountpoint is not a mount yet"
        yield mnt
    finally:
        if is_mounted(mnt):
            problem = unmount(mnt)
    if problem:
        raise AssertionError(problem)


# ----------------------------------------------------------------------------------------------
# session-wide stores and mounts


class Stores:
    """Lazily written fixture stores and their mounts, one of each per writer per session."""

    def __init__(self, tmp_path_factory, stack: contextlib.ExitStack):
        self.factory = tmp_path_factory
        self.stack = stack
        self._infos: dict[str, list] = {}
        self._roots: dict[str, Path] = {}
        self._expected: dict[str, zarr_reference.ExpectedStore] = {}
        self._mounts: dict[str, Path] = {}
        self._twins: dict[str, tuple[Path, zarr_reference.ExpectedStore]] = {}
        self._failed: dict[str, str] = {}

    def root(self, writer: str) -> Path:
        if writer not in self._roots:
            root = self.factory.mktemp(f"orig-{writer}") / "store.zarr"
            self._infos[writer] = writers.write_store(root, writer)
            self._roots[writer] = root
        return self._roots[writer]

    def infos(self, writer: str) -> dict:
        self.root(writer)
        return {i.path: i for i in self._infos[writer]}

    def expected(self, writer: str) -> zarr_reference.ExpectedStore:
        if writer not in self._expected:
            self._expected[writer] = zarr_reference.expected_store(self.root(writer))
        return self._expected[writer]

    def twin(self, writer: str):
        if writer not in self._twins:
            root = self.factory.mktemp(f"twin-{writer}") / "store.zarr"
            writers.write_store(root, writer, unsharded=True)
            self._twins[writer] = (root, zarr_reference.expected_store(root))
        return self._twins[writer]

    def mount(self, key: str, src=None) -> Path:
        """Mount a writer's store (or SRC under KEY) once per session."""
        if key in self._failed:
            pytest.fail(f"mount of {key} failed earlier in this session: {self._failed[key]}")
        if key not in self._mounts:
            src = self.root(key) if src is None else src
            base = self.factory.mktemp(f"mnt-{key}")
            try:
                self._mounts[key] = self.stack.enter_context(
                    zvfs_mount(src, base / "mnt", log=base / "zvfs.log"))
            except BaseException as e:  # remember, so the other tests fail fast
                self._failed[key] = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise
        return self._mounts[key]

    def log(self, key: str) -> Path:
        return self._mounts[key].parent / "zvfs.log"


READER = "zvfsreader"  # the other user of allow_other mounts (created once, a system user)


@pytest.fixture(scope="session")
def reader() -> int:
    """The uid of a real non-root user, for what other users read through a mount."""
    import pwd

    if subprocess.run(["id", READER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", READER],
                       check=True, capture_output=True)
    return pwd.getpwnam(READER).pw_uid


def as_reader(*cmd) -> subprocess.CompletedProcess:
    """`cmd` run as the reader user."""
    return subprocess.run(["runuser", "-u", READER, "--", *map(str, cmd)], capture_output=True, timeout=60)


@pytest.fixture
def public_tmp():
    """A directory every user may reach. pytest's own are 0700, and a store under them is
    closed to everyone but root through a mount, as the store's own permissions say."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="zvfs-public-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tmp_base(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="session", autouse=True)
def no_mounts_left_behind(tmp_base):
    """Session-end check: no FUSE mount may remain under the test's temporary directories."""
    yield
    left = fuse_mounts_under(tmp_base)
    for m in left:
        force_unmount(m)
    assert not left, f"FUSE mounts left behind by the tests (now force-unmounted): {left}"


@pytest.fixture(scope="session")
def stores(tmp_path_factory, no_mounts_left_behind):
    with contextlib.ExitStack() as stack:
        yield Stores(tmp_path_factory, stack)


def pytest_sessionfinish(session, exitstatus):
    # last resort (e.g. an interrupted run): never leave mounts behind
    try:
        base = session.config._tmp_path_factory.getbasetemp()
    except Exception:
        return
    for m in fuse_mounts_under(base):
        force_unmount(m)


# ----------------------------------------------------------------------------------------------
# parametrization helpers

WRITER_ARRAYS = [(w, c.path) for w in writers.WRITERS for c in writers.CASES]


def writer_array_id(v):
    return f"{v[0]}:{v[1]}" if isinstance(v, tuple) else str(v)


def array_kind(case: writers.Case) -> str:
    if not case.sharded:
        return "plain"
    return "as_stored" if case.stored_as_is else "unshard"
