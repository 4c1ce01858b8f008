"""Operating the daemon: credentials out of argv, interrupted mounts, why a mount failed, where
the log goes (syslog, journald, logrotate), the working directory, live stats and refresh."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import ZVFS, force_unmount, is_mounted, run_zvfs, zvfs_mount
from servers import DelayProxy, Nginx

import zvfs

SAMPLE = zvfs.SAMPLE_STORE
MOUNT_ZVFS = Path(sys.executable).parent / "mount.zvfs"
SECRET = "s3cr3tpw"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The sample store over HTTP (nginx), and the same behind 1 s of latency per request."""
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(SAMPLE, root / "brain.zarr")
    ng = Nginx(root, tmp_path_factory.mktemp("nginx")).start()
    slow = DelayProxy(ng.port, delay=1.0).start()
    yield ng, slow
    slow.stop()
    ng.stop()


def _daemon_pids(mnt: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"zvfs mount .* {mnt} --foreground"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _talks_to(pid: int, port: int) -> bool:
    """Whether process `pid` has a TCP connection to 127.0.0.1:`port` (it is opening the source)."""
    try:
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    for row in table:
        fields = row.split()
        if fields[2].endswith(f":{port:04X}") and f"socket:[{fields[9]}]" in sockets:
            return True
    return False


def _same_as_sample(mnt: Path) -> None:
    for path in ("raw/0", "labels"):
        assert np.array_equal(zarr.open_array(mnt / path, mode="r")[...], zarr.open_array(Path(SAMPLE) / path, mode="r")[...])


def _wait(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- credentials


def test_foreground_keeps_credentials_out_of_its_argv(served, tmp_path):
    """The systemd unit's form: `zvfs mount --foreground URL DIR`, one process for its life."""
    ng, _ = served
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    url = f"http://zvuser:{SECRET}@127.0.0.1:{ng.port}/brain.zarr"
    proc = subprocess.Popen([*ZVFS, "mount", "--foreground", url, str(mnt)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: os.path.ismount(mnt) or proc.poll() is not None, 60, "the mount")
        assert os.path.ismount(mnt), f"daemon exited with {proc.returncode}"
        title = _cmdline(proc.pid)  # the same pid: re-executed, not forked
        assert SECRET not in title and "zvuser" not in title, title
        assert f"127.0.0.1:{ng.port}/brain.zarr" in title
        _same_as_sample(mnt)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        force_unmount(mnt)


def test_mount_helper_keeps_credentials_out_of_every_argv(served, tmp_path):
    """mount(8) runs `mount.zvfs URL DIR -o OPTS`: neither the helper (while it waits) nor the
    daemon it starts shows the password."""
    _, slow = served
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    url = f"http://zvuser:{SECRET}@127.0.0.1:{slow.port}/brain.zarr"
    helper = subprocess.Popen([str(MOUNT_ZVFS), url, str(mnt), "-o", "ro"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: "-m zvfs" in _cmdline(helper.pid), 10, "the helper to re-execute")
        seen = []
        while helper.poll() is None:  # the slow source keeps it waiting for seconds
            seen.append(_cmdline(helper.pid) if helper.poll() is None else "")
            seen += [_cmdline(p) for p in _daemon_pids(mnt)]
            time.sleep(0.2)
        assert helper.returncode == 0
        seen += [_cmdline(p) for p in _daemon_pids(mnt)]
        assert len(seen) > 3 and any("--foreground" in s for s in seen)
        assert not [s for s in seen if SECRET in s or "zvuser" in s], seen
    finally:
        helper.kill()
        force_unmount(mnt)


# --------------------------------------------------------------------------- interrupted mounts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_zvfs_mount_while_the_source_opens_leaves_nothing(served, tmp_path, sig):
    _, slow = served
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen([*ZVFS, "mount", f"{slow.url}/brain.zarr", str(mnt)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f)
    try:
        _wait(lambda: any(_talks_to(p, slow.port) for p in _daemon_pids(mnt)), 30, "the daemon to open the source")
        time.sleep(0.5)  # the daemon is opening the source (every request takes 1 s)
        assert not is_mounted(mnt)
        proc.send_signal(sig)
        assert proc.wait(30) == 128 + sig
        msg = err.read_text().strip()
        assert "\n" not in msg and "interrupted" in msg and "nothing mounted" in msg, msg
        _wait(lambda: not _daemon_pids(mnt), 30, "the daemon to exit")
        time.sleep(1)
        assert not is_mounted(mnt), "the interrupted mount came up anyway"
    finally:
        proc.kill()
        for pid in _daemon_pids(mnt):
            os.kill(pid, signal.SIGKILL)
        force_unmount(mnt)


def test_a_foreground_daemon_signalled_while_opening_mounts_nothing(served, tmp_path):
    _, slow = served
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([*ZVFS, "mount", "--foreground", f"{slow.url}/brain.zarr", str(mnt)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(lambda: _talks_to(proc.pid, slow.port), 30, "the daemon to open the source")
        assert not is_mounted(mnt)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
        assert "interrupted" in proc.stderr.read().decode()
        time.sleep(1)
        assert not is_mounted(mnt)
    finally:
        proc.kill()
        force_unmount(mnt)


# --------------------------------------------------------------------------- why a mount failed


def test_a_mount_the_kernel_refuses_says_why_with_fusermounts_words(tmp_path):
    """Without CAP_SYS_ADMIN libfuse falls back to fusermount3, which cannot mount either: its
    own message comes back to `zvfs mount`, with a hint."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", *ZVFS, "mount", SAMPLE, str(mnt)],
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 1, lines
    assert len(lines) == 2 and "Traceback" not in r.stderr.decode(), lines
    assert "fusermount3: mount failed: Operation not permitted" in lines[0]
    assert lines[1].startswith("zvfs: hint:")
    assert not is_mounted(mnt)


def test_a_missing_dev_fuse_is_explained(tmp_path):
    """A mount namespace whose /dev has no fuse device (a container started without it)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f"mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec {' '.join(ZVFS)} mount {SAMPLE} {mnt}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 1, lines
    assert len(lines) == 2 and "modprobe fuse" in lines[0], lines
    assert "/dev/fuse" in lines[1] and lines[1].startswith("zvfs: hint:")


# --------------------------------------------------------------------------- logs and working directory


def test_a_background_daemon_logs_to_syslog(tmp_path):
    """Without log=, the daemon's lines go to /dev/log (journald or syslogd): checked in a mount
    namespace whose /dev/log is a socket this test reads."""
    sock_path = tmp_path / "log.sock"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        sock.settimeout(10)
        z = " ".join(ZVFS)
        script = (f"mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/fuse c 10 229 "
                  f"&& touch /dev/log && mount --bind {sock_path} /dev/log "
                  f"&& {z} mount {SAMPLE} {mnt} && ls {mnt} && {z} umount {mnt}")
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=90, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout.decode().split() == ["labels", "raw", "zarr.json"]
        got = []
        while not any(b"unmounted" in g for g in got):
            got.append(sock.recv(65536))
    text = [g.decode() for g in got]
    mounted = next(t for t in text if "mounted" in t and "unmounted" not in t)
    assert re.match(r"<30>zvfs\[\d+\]: ", mounted), mounted  # facility daemon (3), priority info (6)
    assert SAMPLE in mounted and str(mnt) in mounted


def test_foreground_under_systemd_logs_with_journal_priorities(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        st = os.fstat(f.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        proc = subprocess.Popen([*ZVFS, "mount", "--foreground", SAMPLE, str(mnt)], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f)
    try:
        _wait(lambda: os.path.ismount(mnt), 60, "the mount")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        force_unmount(mnt)
    lines = err.read_text().splitlines()
    assert lines and all(re.match(r"<[0-7]>", ln) for ln in lines), lines
    assert any(ln.startswith("<6>") and "mounted" in ln for ln in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", ln) for ln in lines), "journald adds its own timestamps"


def test_sighup_reopens_a_rotated_log_and_does_not_unmount(tmp_path):
    log = tmp_path / "zvfs.log"
    with zvfs_mount(SAMPLE, tmp_path / "mnt", log=log) as mnt:
        (pid,) = _daemon_pids(mnt)
        os.rename(log, tmp_path / "zvfs.log.1")  # what logrotate does
        os.kill(pid, signal.SIGHUP)
        _wait(lambda: log.exists() and "reopened" in log.read_text(), 10, "the log to be reopened")
        assert os.path.ismount(mnt)
        _same_as_sample(mnt)
        assert os.readlink(f"/proc/{pid}/fd/2") == str(log), "stderr (libfuse's messages) still goes to the old file"
    assert "unmounted" in log.read_text()
    assert "mounted" in (tmp_path / "zvfs.log.1").read_text()


def test_the_daemon_runs_in_the_root_directory(tmp_path):
    """Relative paths work, and the daemon keeps no directory busy."""
    work = tmp_path / "work"
    (work / "mnt").mkdir(parents=True)
    mnt = work / "mnt"
    r = run_zvfs("mount", os.path.relpath(SAMPLE, work), "mnt", workdir=work)
    try:
        assert r.returncode == 0, r.stderr
        (pid,) = _daemon_pids(mnt)
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        _same_as_sample(mnt)
    finally:
        force_unmount(mnt)


# --------------------------------------------------------------------------- stats and refresh


def test_stats_and_refresh_of_a_live_mount(tmp_path):
    with zvfs_mount(SAMPLE, tmp_path / "mnt") as mnt:
        files = sorted(p for p in (mnt / "raw" / "0" / "c").rglob("*") if p.is_file())[:5]
        served = sum(len(p.read_bytes()) for p in files)
        assert served == sum(p.stat().st_size for p in files) > 0
        r = run_zvfs("stats", mnt, "--json")
        assert r.returncode == 0, r.stderr
        stats = json.loads(r.stdout)
        for key in ("zvfs_version", "files_read", "bytes_served", "pushed", "bytes_pushed", "backend_requests", "backend_bytes", "retries", "eio", "caches"):
            assert key in stats, key
        assert stats["zvfs_version"] == zvfs.__version__
        # (files read in listing order are partly pushed into the kernel's cache ahead of their open)
        assert stats["files_read"] >= len(files) and stats["bytes_served"] + stats["bytes_pushed"] >= served
        assert stats["eio"] == 0
        # a local store counts its reads too: at least the chunk bytes served came from shards
        assert stats["backend_requests"] > 0 and stats["backend_bytes"] >= stats["bytes_served"] > 0
        assert all({"hits", "misses", "bytes"} <= set(c) for c in stats["caches"].values())
        human = run_zvfs("stats", mnt)
        assert human.returncode == 0 and "files read" in human.stdout.decode()
        assert ".zvfs.stats" not in os.listdir(mnt) and ".zvfs.refresh" not in os.listdir(mnt)
        r = run_zvfs("refresh", mnt)
        assert r.returncode == 0, r.stderr
        _same_as_sample(mnt)
    r = run_zvfs("stats", tmp_path / "mnt")
    assert r.returncode == 1 and "not mounted" in r.stderr.decode()


def test_a_stores_own_control_names_never_serve_two_files(tmp_path):
    """A store holding `.zvfs.stats` and `.zvfs.refresh` at its root (forged stats): the names
    are the control files', whether looked up or listed first; the store's are not listed, and
    `zvfs stats` reads the daemon's figures (an attack: listing first served the store's file,
    and `zvfs stats` printed its forged source)."""
    store = tmp_path / "store"
    shutil.copytree(SAMPLE, store)
    forged = json.dumps({"zvfs_version": "0", "source": "FAKE"})
    (store / ".zvfs.stats").write_text(forged)
    (store / ".zvfs.refresh").write_text("x")
    with zvfs_mount(store, tmp_path / "mnt") as mnt:
        listed = os.listdir(mnt)
        assert ".zvfs.stats" not in listed and ".zvfs.refresh" not in listed and "raw" in listed
        r = run_zvfs("stats", mnt, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["source"] != "FAKE"
        assert (mnt / ".zvfs.stats").read_text() != forged


def _as_user_with_fuse(tmp_path: Path, zvfs_args: list[str]) -> subprocess.CompletedProcess:
    """Run `zvfs ARGS` as the unprivileged user nobody, in a mount namespace whose /dev/fuse is
    usable by users (mode 666, as Debian's fuse3 sets it up): libfuse then goes through the
    set-uid fusermount3, as for any user. The interpreter is the system's python3 of the same
    version with this checkout and the virtualenv's packages on its path (the virtualenv's
    own interpreter lives under /root, closed to other users)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True).stdout.strip()
    assert version == str(sys.version_info[:2]), f"{python} is Python {version}, the virtualenv {sys.version_info[:2]}"
    path = ":".join([str(Path(zvfs.__file__).parents[1]), *site.getsitepackages()])
    dev = tmp_path / "dev"
    dev.mkdir()
    z = f"env PYTHONPATH={path} {python} -m zvfs " + " ".join(map(str, zvfs_args))
    script = f"mknod -m 666 {dev}/fuse c 10 229 && mount --bind {dev}/fuse /dev/fuse && exec runuser -u nobody -- {z}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=90, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("case", ["allow_other without user_allow_other", "mount point not the user's"])
def test_a_users_failed_mount_says_why_and_what_to_do(tmp_path, case):
    with open("/etc/fuse.conf") as f:
        assert not any(ln.strip() == "user_allow_other" for ln in f), "this test expects the stock /etc/fuse.conf"
    base = Path(tempfile.mkdtemp(prefix="zvfs-user-"))  # pytest's own directories are closed to other users
    base.chmod(0o755)
    mnt = base / "mnt"
    mnt.mkdir()
    try:
        if case.startswith("allow_other"):
            os.chown(mnt, 65534, 65534)  # nobody's
            r = _as_user_with_fuse(tmp_path, ["mount", SAMPLE, mnt, "-o", "allow_other"])
            said, hint = "user_allow_other", "/etc/fuse.conf"
        else:
            r = _as_user_with_fuse(tmp_path, ["mount", SAMPLE, mnt])
            said, hint = "no write access to mountpoint", "directory you own"
    finally:
        for pid in _daemon_pids(mnt):  # a mount that came up lives in the namespace of its daemon
            os.kill(pid, signal.SIGTERM)
        shutil.rmtree(base, ignore_errors=True)
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 1, lines
    assert len(lines) == 2 and "Traceback" not in r.stderr.decode(), lines
    assert "fusermount3" in lines[0] and said in lines[0], lines
    assert lines[1].startswith("zvfs: hint:") and hint in lines[1], lines
    assert not is_mounted(mnt)


@pytest.mark.parametrize("said, hint", [
    ("fusermount3: user has no write access to mountpoint /mnt/x", "directory you own"),
    ("fusermount3: failed to access mountpoint /mnt/x: Permission denied", "directory you own"),
    ("fusermount3: option allow_other only allowed if 'user_allow_other' is set in /etc/fuse.conf", "/etc/fuse.conf"),
    ("/data/store.zarr: cannot open: [Errno 13] Permission denied: '/data/store.zarr/zarr.json'", None),
    ("/data/store.zarr/zarr.json: not readable by this user (Permission denied)", None),
])
def test_a_refusal_gets_a_hint_only_where_it_applies(said, hint):
    """A store this user cannot read is refused in its own words: no hint to mount on a
    directory they own (every 'Permission denied' got it)."""
    from zvfs.fronts.mounting import explain

    lines = explain(said, "").splitlines()
    assert lines[0] == said
    if hint is None:
        assert len(lines) == 1, lines
    else:
        assert len(lines) == 2 and lines[1].startswith("hint: ") and hint in lines[1], lines
