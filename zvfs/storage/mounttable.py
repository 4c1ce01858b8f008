"""Which mount each local path is on, and the filesystem type there (from
/proc/self/mountinfo): the local store decides from it which I/O may run on the event loop."""

from __future__ import annotations

import os
import re
import select

#: Filesystems whose syscalls are served from memory or a local block device: their metadata
#: calls and page-cached reads may run on the trio thread. Anything else may stall for as long
#: as a server or a FUSE daemon likes, so all its I/O goes to worker threads.
LOCAL_FS_TYPES = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "jfs", "reiserfs", "zfs", "tmpfs",
    "ramfs", "overlay", "squashfs", "erofs", "iso9660", "udf", "vfat", "exfat", "ntfs3",
})
#: Of those, the ones whose data lives in memory: a plain pread never waits for a device. They
#: need it: tmpfs refuses RWF_NOWAIT (EOPNOTSUPP, checked here), which would otherwise send
#: every read of a store in /dev/shm (or a tmpfs /tmp) to a worker thread. Measured: 4 KiB
#: read 1.59 us before, 1.64 us now (3.75 us with expect=); 64 KiB 8.6 us, 8.8 us.
MEMORY_FS_TYPES = frozenset({"tmpfs", "ramfs"})
#: Filesystems that give a file changed after a stat of it a timestamp different from the one
#: that stat showed (multigrain timestamps, Linux 6.13 and later: ext4, xfs, btrfs, tmpfs; on
#: this machine, 0 of 2,000 write-after-fstat pairs kept the mtime, on ext4 and on tmpfs).
#: On them a version looked at with no write in progress is settled at once (storage/local.py).
FINE_TIMESTAMPS = frozenset({"ext4", "xfs", "btrfs", "tmpfs"}) if tuple(
    int(p) for p in re.findall(r"\d+", os.uname().release)[:2]) >= (6, 13) else frozenset()


class MountTable:
    """Which mount each path is on, from /proc/self/mountinfo; re-read only when the kernel
    reports a change of the table (POLLPRI on the open file). A lookup costs one poll and,
    per directory, one walk up its ancestors (remembered: ~1 us instead of ~7 us for a scan
    of the table)."""

    MEMO = 4096  # directories remembered

    def __init__(self):
        self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI)
        self._types: dict[str, str] = {}  # mount point -> filesystem type of the visible mount
        self._memo: dict[str, tuple[str, str]] = {}
        self.loads = 0  # times the table was read (`version`)
        self._load()

    def _load(self) -> None:
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 1 << 16):
            chunks.append(chunk)
        types = {}
        for line in b"".join(chunks).decode(errors="replace").splitlines():
            fields, _, tail = line.partition(" - ")
            parts = fields.split()
            if len(parts) >= 5 and tail:  # later lines win: of stacked mounts the last is visible
                types[re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[4])] = tail.split()[0]
        self._types = types
        self._memo = {}
        self.loads += 1

    def version(self) -> int:
        """A number that changes whenever the table does (a mount or unmount anywhere: a bind
        mount over a store's directory sends no inotify event, storage/dirwatch.py)."""
        if self._poll.poll(0):
            self._load()
        return self.loads

    def mount_of(self, path: str) -> tuple[str, str]:
        """(mount point, filesystem type) of the deepest mount containing `path`, an absolute
        path without symlinks, `.` or `..`."""
        if self._poll.poll(0):
            self._load()
        fstype = self._types.get(path)
        if fstype is not None:
            return path, fstype
        parent = path.rpartition("/")[0] or "/"
        found = self._memo.get(parent)
        if found is None:
            point = parent
            while point not in self._types and point != "/":
                point = point.rpartition("/")[0] or "/"
            found = (point, self._types.get(point, ""))
            if len(self._memo) >= self.MEMO:
                self._memo.clear()
            self._memo[parent] = found
        return found

    def stalling_points(self) -> frozenset[str]:
        """Mount points of filesystems not known to be local (their root may not answer)."""
        if self._poll.poll(0):
            self._load()
        return frozenset(point for point, fstype in self._types.items() if fstype not in LOCAL_FS_TYPES)

    def close(self) -> None:
        os.close(self._fd)
