"""Daemon lifecycle through the kernel: systemd readiness, signals, stale and busy mounts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ZVFS, force_unmount, is_mounted, run_zvfs, zvfs_mount

import zvfs

SAMPLE = zvfs.SAMPLE_STORE


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_foreground_daemon_notifies_systemd_and_unmounts_on_signal(tmp_path, sig):
    notify = tmp_path / "notify.sock"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify))
        sock.settimeout(60)
        proc = subprocess.Popen([*ZVFS, "mount", "--foreground", SAMPLE, str(mnt)],
                                env={**os.environ, "NOTIFY_SOCKET": str(notify)},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert sock.recv(64) == b"READY=1"
            assert os.path.ismount(mnt)  # READY only once the mount is live
            assert "raw" in os.listdir(mnt)
            proc.send_signal(sig)
            assert proc.wait(timeout=30) == 0
            assert not is_mounted(mnt)
            assert b"unmounted" in proc.stderr.read()
        finally:
            proc.kill()
            force_unmount(mnt)


def test_mount_recovers_a_stale_mount_point_left_by_a_killed_daemon(tmp_path):
    mnt = tmp_path / "mnt"
    try:
        with zvfs_mount(SAMPLE, mnt):
            pids = subprocess.run(["pgrep", "-f", f"zvfs mount {SAMPLE} {mnt}"], capture_output=True, text=True).stdout.split()
            assert pids, "daemon process not found"
            for pid in pids:
                os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.3)
            with pytest.raises(OSError) as e:
                os.listdir(mnt)
            assert e.value.errno == 107  # ENOTCONN: "Transport endpoint is not connected"
            r = run_zvfs("mount", SAMPLE, mnt)
            assert r.returncode == 0, r.stderr
            assert sorted(os.listdir(mnt)) == ["labels", "raw", "zarr.json"]
    finally:
        force_unmount(mnt)


def test_mounting_twice_is_refused_with_one_line(tmp_path):
    with zvfs_mount(SAMPLE, tmp_path / "mnt") as mnt:
        r = run_zvfs("mount", SAMPLE, mnt)
        assert r.returncode == 2
        assert r.stderr.decode().strip().count("\n") == 0 and "already mounted" in r.stderr.decode()


def test_umount_of_a_busy_mount_says_so_and_lazy_works(tmp_path):
    with zvfs_mount(SAMPLE, tmp_path / "mnt") as mnt:
        holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],'rb'); time.sleep(60)",
                                   str(mnt / "raw" / "0" / "zarr.json")])
        try:
            time.sleep(0.5)
            r = run_zvfs("umount", mnt)
            assert r.returncode == 1
            assert "busy" in r.stderr.decode() and "--lazy" in r.stderr.decode()
            assert is_mounted(mnt)
            r = run_zvfs("umount", "--lazy", mnt)
            assert r.returncode == 0 and not is_mounted(mnt)
        finally:
            holder.kill()
            holder.wait()


def test_an_fstab_line_mounts_through_mount_8(tmp_path):
    """`SOURCE DIR fuse.zvfs ro,nofail 0 0`, read by mount(8) from a test fstab (-T)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{SAMPLE} {mnt} fuse.zvfs ro,nofail,noatime,x-test=1 0 0\n")
    try:
        r = subprocess.run(["mount", "-T", str(fstab), str(mnt)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert os.path.ismount(mnt)
        assert sorted(os.listdir(mnt / "raw" / "0" / "c" / "0")) == ["0", "1", "2", "3"]  # grid 4x4x4
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    finally:
        force_unmount(mnt)


def test_systemd_unit_template_is_valid(tmp_path):
    unit = (Path(__file__).resolve().parents[1] / "systemd" / "zvfs@.service").read_text()
    assert "Type=notify" in unit and "--foreground" in unit and "Restart=on-failure" in unit
    instance = tmp_path / "zvfs@brain.service"
    instance.write_text(unit.replace("%i", "brain").replace("%I", "brain"))
    r = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_chunk_files_can_be_mmapped(tmp_path):
    """Readers that mmap chunk files work (no direct I/O on the mount)."""
    import mmap

    with zvfs_mount(SAMPLE, tmp_path / "mnt") as mnt:
        chunk = mnt / "raw" / "0" / "c" / "1" / "2" / "3"
        data = chunk.read_bytes()
        with open(chunk, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            assert m[:] == data and len(data) == chunk.stat().st_size > 0
