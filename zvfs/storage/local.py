"""Local-disk store: page-cached reads on the trio thread, everything that can block in threads.

All FUSE handlers share one trio thread, so one syscall that blocks (an `open` of a FIFO, a
read from a hung NFS mount, a disk read of uncached data) would freeze every request on the
mount. Measured on this machine (2 shared cores, ext4, page cache warm; loops of 10^4 calls,
best of 5-15 rounds):

    os.pread 4 KiB 0.9 us, 64 KiB 5.5 us | preadv(RWF_NOWAIT) + bytes 1.6 us, 7.5 us
    one trio.to_thread.run_sync hop ~107 us | fstat 1.2 us | stat of a path 1.8-2.1 us
    LocalStore.read, old (plain pread) vs now, same process, interleaved rounds:
      4 KiB 1.45 -> 2.33 us (4.38 us with expect=, i.e. + one fstat), 64 KiB 5.2 -> 7.8 us
    current() of an open key: 4.3 us with os.stat, 9-11 us with the never-waiting lookup
    per chunk file as the tree does it (current() at open, one 4 KiB read with expect=), old
      store with naive stubs vs now: median 11.5 -> 14.6 us

so a thread hop per read would cost 20-100x a cached read, while the page-cache-only fast
path (`RWF_NOWAIT`: answers from the page cache or fails with EAGAIN, never waits for a disk)
costs 1-3 us per request, against the ~90 us pyfuse3 spends per request. Through real mounts
(only this module differing, fresh mount per run, `find DIR -type f | xargs cat`, 9
alternating runs on a loaded machine; medians, then fastest runs): 1024 files of 4 KiB
0.344 s now vs 0.328 s before (0.240 vs 0.228), 256 files of 64 KiB 0.103 vs 0.099 s (0.073
vs 0.069): within the noise, at most the ~3 us per file that the version checks cost. Hence:

* reads of files on local disk or memory filesystems try `preadv(RWF_NOWAIT)` on the trio
  thread and fall back to a worker thread when the data is not cached (or the filesystem does
  not support RWF_NOWAIT); the `fstat` that ties a read to a `Version` stays on the loop;
* files on filesystems that can stall without bound (NFS, CIFS, FUSE, anything not known to be
  local, judged from /proc/self/mountinfo) do every syscall in worker threads;
* opens of plain paths on local filesystems whose every component is in the kernel's caches
  run on the loop (`openat2(RESOLVE_CACHED)`, ~9 us); all other opens, and all listings, run
  in worker threads. 4096 shards opened and index-read: 145-180 us per shard with every open
  in a thread, 30 us with cached opens, 22 us with the old blocking opens; through a mount
  (`find -type f | xargs cat` over 4096 one-chunk shards, medians of 7 alternating runs on a
  loaded machine) 3.70 s now vs 3.91 s before (4.69 s vs 2.20 s with every open in a
  thread). Each mount point under the store has its own thread limiter: a hung mount holds
  at most `THREADS_PER_MOUNT` threads and costs the files that live on it, never the rest of
  the store;
* only regular files are ever opened (O_PATH and fstat first on the loop, stat first in a
  thread, then O_NONBLOCK|O_NOCTTY and fstat again): a FIFO, socket or device is a one-line
  `StorageError` naming the key, EIO for its files;
* nothing outside the store root is served unless `follow_symlinks`: what an open really
  reached is checked on the descriptor itself (/proc/self/fd), so a symlink swapped in between
  a check and the open cannot leak a file; listings drop entries that lead outside and
  directories that lead back to one of their own ancestors (`junk/a -> .`).

File descriptors of shards are kept open in a small LRU because shards are read many times.
`current()` (called on every chunk-file open) looks the path up on the loop from the kernel's
caches only (O_PATH openat2 + fstat, 9-11 us in all; a plain stat is 4.3 us but would follow
a directory swapped for a symlink into a hung mount, or wait for a disk): ~5 us more than a
stat, ~5% of the ~90 us pyfuse3 spends per open, the price of never freezing the mount. A
thread read works on a `dup` of the descriptor, so closing an evicted descriptor can never
make a pending read hit whatever reuses its number.

Versions: `read(expect=V)` checks the file with one fstat *after* the read. A writer updates
mtime/ctime before it copies data, so a file that still matches V after the read was not
written during it. An atomic replace also moves the old file's ctime (it loses a link), so its
still-open descriptor stops matching V too: the caller re-locates rather than reading old
bytes, which is never wrong, only a re-read.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import select
import stat
from collections import OrderedDict
from dataclasses import dataclass

import trio

from ..errors import ShardChanged, StorageError
from .base import Entry, Store, Version

log = logging.getLogger("zvfs.storage.local")

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
#: Worker threads per mount point: enough for parallel uncached disk reads, few enough that a
#: hung mount cannot pile up threads without bound.
THREADS_PER_MOUNT = 8
#: read_version retries when the file changes under the read before giving up (EIO).
STABLE_READ_ATTEMPTS = 3

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SLOW = object()  # "ask a worker thread"


class _OpenHow(ctypes.Structure):  # struct open_how of openat2(2)
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


SYS_OPENAT2 = 437  # one number on every architecture (new syscalls share the generic table)
RESOLVE_NO_SYMLINKS, RESOLVE_CACHED = 0x04, 0x20
AT_FDCWD = -100
_syscall = ctypes.CDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_HOW = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_CACHED | RESOLVE_NO_SYMLINKS)
_HOW_ADDRESS, _HOW_SIZE = ctypes.addressof(_HOW), ctypes.sizeof(_HOW)


def _open_path_if_cached(path: str) -> int:
    """An O_PATH descriptor of `path` (nothing is opened: no FIFO or device open runs), from
    the kernel's caches only: `openat2(RESOLVE_CACHED | RESOLVE_NO_SYMLINKS)` fails with
    EAGAIN where the lookup would need I/O or revalidation (never waits, the open analogue of
    RWF_NOWAIT), ELOOP at a symlink; ENOSYS/EINVAL on kernels before 5.12."""
    fd = _syscall(SYS_OPENAT2, AT_FDCWD, os.fsencode(path), _HOW_ADDRESS, _HOW_SIZE)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return fd


def _state(st: os.stat_result) -> tuple:
    """What tells one state of a file's bytes from another: `Version.size` and `Version.tag`."""
    return st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _matches(st: os.stat_result, v: Version) -> bool:
    return (v.size, v.tag) == _state(st)  # not Version.same(version_of(st)): 4x the cost


def version_of(st: os.stat_result) -> Version:
    size, tag = _state(st)
    return Version(size, tag, st.st_mtime, stat.S_IMODE(st.st_mode))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _span(size: int, start: int, length: int | None) -> tuple[int, int]:
    """Offset and length of a read; a negative start counts from the end."""
    if start < 0:
        start = max(0, size + start)
        return start, size - start
    return start, max(0, size - start) if length is None else length


def _read_blocking(fd: int, start: int, length: int | None, stable: bool) -> tuple[bytes, os.stat_result] | None:
    """A read in a worker thread, on a dup'ed descriptor that it closes. With `stable`, the
    bytes and the returned stat come from one unchanged state of the file (fstat before and
    after agree), retried a few times; None if the file kept changing."""
    try:
        for _ in range(STABLE_READ_ATTEMPTS):
            before = os.fstat(fd)
            off, n = _span(before.st_size, start, length)
            data = os.pread(fd, n, off)
            after = os.fstat(fd)
            if not stable or _state(before) == _state(after):
                return data, after
        return None
    finally:
        os.close(fd)


def _close(fd: int, local: bool) -> None:
    """Close on the loop for local filesystems; elsewhere in a thread of its own, not awaited:
    close(2) on FUSE sends a synchronous FLUSH, which a hung filesystem never answers."""
    if local:
        os.close(fd)
    else:
        trio.lowlevel.start_thread_soon(lambda: os.close(fd), lambda _outcome: None)


def _fstat_blocking(fd: int) -> os.stat_result:
    """fstat in a worker thread, of a dup'ed descriptor that it closes."""
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


class _MountTable:
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


@dataclass(slots=True)
class _Open:
    """A cached descriptor of a key: the file it reached, and how its I/O may be done."""

    fd: int
    ident: tuple[int, int]  # (st_dev, st_ino) of the file opened
    mount: str  # mount point of the file (its thread limiter)
    local: bool  # on a local filesystem: page-cached reads and fstat on the trio thread
    nowait: bool = True  # reads may be tried on the loop (cleared on EOPNOTSUPP of RWF_NOWAIT)
    memory: bool = False  # data in memory (tmpfs): plain pread on the loop
    version: Version | None = None  # the last Version handed out for this file


class LocalStore(Store):
    def __init__(self, root: str, max_open_files: int = 256, follow_symlinks: bool = False):
        self.root = os.path.abspath(root)
        self.display = self.root
        self.real_root = os.path.realpath(root)
        self._inside_prefix = self.real_root.rstrip("/") + "/"
        self.follow_symlinks = follow_symlinks
        self._fds: OrderedDict[str, _Open] = OrderedDict()
        self._max_open = max_open_files
        self._mounts = _MountTable()
        self._limiters: dict[str, trio.CapacityLimiter] = {}
        self._warned: set[str] = set()
        self._cached_opens = True  # openat2(RESOLVE_CACHED) works on this kernel
        self._scratch = memoryview(bytearray(1 << 20))  # RWF_NOWAIT target of reads up to 1 MiB

    # -- paths, limits, descriptors ------------------------------------------------------

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key) if key else self.root

    def _inside(self, real: str) -> bool:
        return self.follow_symlinks or real == self.real_root or real.startswith(self._inside_prefix)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", message)

    async def _in_thread(self, mount: str, fn, *args):
        limiter = self._limiters.get(mount)
        if limiter is None:
            limiter = self._limiters[mount] = trio.CapacityLimiter(THREADS_PER_MOUNT)
        # abandon_on_cancel: a call stuck on a hung mount must not keep the daemon from exiting
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=True)

    def _real_path(self, key: str) -> str:
        """The path of `key` below the real root, as it reads (symlinks not resolved)."""
        path = self._inside_prefix + key if key else self.real_root
        return os.path.normpath(path) if "/." in path or "//" in path or path.endswith("/") else path

    def _lexical_mount(self, key: str) -> str:
        return self._mounts.mount_of(self._real_path(key))[0]

    def _open_blocking(self, key: str) -> tuple[int, os.stat_result, str] | None:
        """Open `key` as a regular file inside the store (worker thread). None: absent or a
        directory. The stat before the open keeps FIFOs and devices from being opened at all;
        the fstat and /proc/self/fd after it judge what was actually opened (race-free)."""
        path = self._path(key)
        try:
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                fd = os.open(path, OPEN_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"{path}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{path}: {_kind(st.st_mode)}, not a file")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(f"{path}: {_kind(st.st_mode)}, not a file")
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not self._inside(real):
                raise StorageError(f"{path}: leads outside the store (to {real}); not followed without -o follow_symlinks")
            os.set_blocking(fd, True)  # O_NONBLOCK was for the open only
        except BaseException:
            os.close(fd)
            raise
        return fd, st, real

    def _lookup_cached(self, path: str):
        """(O_PATH descriptor, its stat) of a plain path (no symlinks, so its mount is the one
        it names) from the kernel's caches only, never waiting; None when known absent (a
        cached negative entry); _SLOW when only a worker thread can tell."""
        if not self._cached_opens:
            return _SLOW
        try:
            pfd = _open_path_if_cached(path)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if e.errno in (errno.ENOSYS, errno.EINVAL):  # kernel without RESOLVE_CACHED
                self._cached_opens = False
            return _SLOW
        try:
            return pfd, os.fstat(pfd)
        except OSError:
            os.close(pfd)
            return _SLOW

    def _open_cached(self, path: str):
        """`_open_blocking` on the trio thread where nothing can block (a path on a local
        filesystem, see `_lookup_cached`). Returns like `_open_blocking`, or _SLOW."""
        got = self._lookup_cached(path)
        if got is None or got is _SLOW:
            return got
        pfd, st = got
        try:
            if stat.S_ISDIR(st.st_mode):
                return None
            if not stat.S_ISREG(st.st_mode):
                return _SLOW  # the worker thread says what it is, in the same words
            # reopening the O_PATH descriptor opens that very inode: no lookup, no race
            return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC), st, path
        except OSError:
            return _SLOW
        finally:
            os.close(pfd)

    async def _get(self, key: str) -> tuple[_Open | None, os.stat_result | None]:
        """The cached descriptor of `key`; on a miss opened from the kernel's caches on the
        loop, or else in a worker thread; with the stat taken at the open (None when the
        descriptor was cached)."""
        o = self._fds.get(key)
        if o is not None:
            self._fds.move_to_end(key)
            return o, None
        path = self._real_path(key)
        point, fstype = self._mounts.mount_of(path)
        got = _SLOW
        if fstype in LOCAL_FS_TYPES and self._inside(path):
            got = self._open_cached(path)
        if got is _SLOW:
            got = await self._in_thread(point, self._open_blocking, key)
        if got is None:
            return None, None
        fd, st, real = got
        point, fstype = self._mounts.mount_of(real)
        local = fstype in LOCAL_FS_TYPES
        if key in self._fds:  # another task opened it meanwhile: keep one descriptor
            _close(fd, local)
            return self._fds[key], None
        o = self._fds[key] = _Open(fd, (st.st_dev, st.st_ino), point, local, memory=fstype in MEMORY_FS_TYPES)
        if len(self._fds) > self._max_open:
            old = self._fds.popitem(last=False)[1]
            _close(old.fd, old.local)
        return o, st

    def _version(self, key: str, st: os.stat_result) -> Version:
        """The Version of `st`, reusing the one last made for `key` while the file is
        unchanged (building a frozen dataclass costs more than the stat)."""
        o = self._fds.get(key)
        if o is not None and o.version is not None and _matches(st, o.version):
            return o.version
        v = version_of(st)
        if o is not None and (st.st_dev, st.st_ino) == o.ident:
            o.version = v
        return v

    def _drop(self, key: str, o: _Open) -> None:
        if self._fds.get(key) is o:
            del self._fds[key]
            _close(o.fd, o.local)

    async def _stat(self, key: str, o: _Open) -> os.stat_result | None:
        """A fresh stat of the path of `key` (whose descriptor is `o`); None if there is none.
        On the loop only from the kernel's caches: a path that changed into a symlink to a
        hung mount must not freeze the loop."""
        got = self._lookup_cached(self._real_path(key)) if o.local else _SLOW
        if got is _SLOW:
            try:
                return await self._in_thread(o.mount, os.stat, self._path(key))
            except OSError:
                return None
        if got is None:
            return None
        os.close(got[0])
        return got[1]

    async def _fstat(self, o: _Open) -> os.stat_result:
        return os.fstat(o.fd) if o.local else await self._in_thread(o.mount, _fstat_blocking, os.dup(o.fd))

    # -- reads ---------------------------------------------------------------------------

    def _pread_cached(self, o: _Open, off: int, n: int) -> bytes | memoryview | None:
        """`n` bytes at `off` if the page cache holds them (a short result at the end of the
        file), as a view of the scratch buffer (valid until the next read); None when the data
        needs a disk read or RWF_NOWAIT is not supported."""
        if o.memory:
            return os.pread(o.fd, n, off)
        # FUSE reads are at most 1 MiB (the mount's read-ahead): the scratch buffer serves them
        # all, so a FUSE read allocates nothing (pyfuse3 replies from the view) and `read`
        # allocates once (the bytes returned), as a plain pread does; a 256 KiB read through a
        # buffer of its own allocated twice and cost 140 us instead of 36. Larger reads (a
        # whole index) get one.
        buf = self._scratch if n <= len(self._scratch) else memoryview(bytearray(n))
        got = 0
        while got < n:  # RWF_NOWAIT reads stop short at read-ahead boundaries: go on while it gives
            try:
                part = os.preadv(o.fd, (buf[got:n],), off + got, os.RWF_NOWAIT)
            except BlockingIOError:
                return None
            except OSError as e:
                if e.errno != errno.EOPNOTSUPP:
                    raise
                o.nowait = False
                return None
            if part == 0:  # the end of the file
                break
            got += part
        return buf[:got]

    async def _read(self, key: str, start: int, length: int | None, stable: bool,
                    after: bool) -> tuple[bytes | None, os.stat_result | None]:
        """Bytes of `key` and, with `after`, a stat taken after the read (with `stable`, the
        stat of the one state the bytes came from)."""
        o, _ = await self._get(key)
        if o is None:
            return None, None
        try:
            if o.local and o.nowait:
                before = os.fstat(o.fd) if stable or start < 0 or length is None else None
                off, n = (start, length) if before is None else _span(before.st_size, start, length)
                view = self._pread_cached(o, off, n) if n else b""
                data = None if view is None else bytes(view)
                if data is not None:
                    st = os.fstat(o.fd) if after or len(data) < n else None
                    complete = len(data) == n or off + len(data) >= st.st_size
                    if complete and (not stable or _state(before) == _state(st)):
                        return data, st
            got = await self._in_thread(o.mount, _read_blocking, os.dup(o.fd), start, length, stable)
        except OSError as e:
            raise StorageError(f"{self._path(key)}: {e.strerror}") from None
        if got is None:
            raise StorageError(f"{self._path(key)}: keeps changing while being read")
        return got

    def read_now(self, key: str, start: int, length: int, expect: Version | None = None) -> bytes | memoryview | None:
        """The hot path (a chunk of an open shard, page cache warm): no awaits, no stat unless
        a version is expected."""
        o = self._fds.get(key)
        if o is None or not (o.local and o.nowait) or start < 0 or not length:
            return None
        self._fds.move_to_end(key)
        try:
            data = self._pread_cached(o, start, length)
            if data is None or len(data) != length:
                return None
            if expect is None or _matches(os.fstat(o.fd), expect):
                return data
        except OSError as e:
            raise StorageError(f"{self._path(key)}: {e.strerror}") from None
        raise ShardChanged(key)

    def still_at(self, key: str, version: Version) -> bool:
        o = self._fds.get(key)
        if o is None or not o.local:
            return False
        try:
            return _matches(os.fstat(o.fd), version)
        except OSError:
            return False

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        now = self.read_now(key, start, length, expect)  # type: ignore[arg-type]  # (None length: not now)
        if now is not None:
            return bytes(now)
        data, st = await self._read(key, start, length, False, expect is not None)
        if expect is not None:
            if st is None:
                raise ShardChanged(key, "deleted while mounted")
            if not _matches(st, expect):
                raise ShardChanged(key)
        return data

    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        data, st = await self._read(key, start, length, True, True)
        return data, None if st is None else self._version(key, st)

    async def current(self, key: str) -> Version | None:
        """A stat of the path (see `_stat`): the same file as the cached
        descriptor gives its current version (an in-place rewrite shows as new size and
        times); another file (atomic replace) or none (deleted) drops the stale descriptor."""
        o = self._fds.get(key)
        if o is not None:
            st = await self._stat(key, o)
            if st is not None and (st.st_dev, st.st_ino) == o.ident:
                return self._version(key, st)
            self._drop(key, o)
        o, st = await self._get(key)
        if o is None:
            return None
        return self._version(key, st or await self._fstat(o))  # no st: another task's open

    async def size(self, key: str) -> int | None:
        o, st = await self._get(key)
        if o is None:
            return None
        return (st or await self._fstat(o)).st_size

    # -- listings ------------------------------------------------------------------------

    async def list(self, prefix: str) -> list[Entry] | None:
        return await self._in_thread(self._lexical_mount(prefix), self._list_blocking, prefix,
                                     self._mounts.stalling_points())

    def _list_blocking(self, prefix: str, stalling: frozenset[str]) -> list[Entry] | None:
        """Entries of a directory (worker thread). Left out: special files (not keys), entries
        that lead outside the store (unless follow_symlinks), and directories that are the
        listed directory or one of the directories on the way down to it (a symlink loop
        such as `junk/a -> .` would otherwise make `find` and `cp -r` run forever). A mount
        point of a filesystem that may stall is listed without a stat of its root (that stat
        would hold this thread, and with it the listings of the mount above, for as long as
        the filesystem hangs): a directory without mode and time."""
        path = self._path(prefix)
        try:
            fd = os.open(path, OPEN_FLAGS | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"{path}: {e.strerror}") from None
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not self._inside(real):
                self._warn_once(path, f"{path}: leads outside the store (to {real}); not listed without -o follow_symlinks")
                return None
            parts = prefix.split("/") if prefix else []
            above = set()
            for i in range(len(parts) + 1):
                st = os.stat(self._path("/".join(parts[:i])))
                above.add((st.st_dev, st.st_ino))
            out = []
            with os.scandir(fd) as it:
                for de in it:
                    if os.path.join(real, de.name) in stalling:
                        out.append(Entry(de.name, True, 0))
                        continue
                    name = f"{path}/{de.name}"
                    if de.is_symlink() and not self._inside(os.path.realpath(os.path.join(real, de.name))):
                        self._warn_once(name, f"{name}: leads outside the store; not listed without -o follow_symlinks")
                        continue
                    try:
                        st = de.stat()
                    except OSError:
                        continue  # dangling symlink, or gone meanwhile
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if is_dir and (st.st_dev, st.st_ino) in above:
                        self._warn_once(name, f"{name}: leads back to a directory above it (a loop); not listed")
                        continue
                    if not is_dir and not stat.S_ISREG(st.st_mode):
                        continue
                    out.append(Entry(de.name, is_dir, 0 if is_dir else st.st_size,
                                     stat.S_IMODE(st.st_mode), st.st_mtime))
            return out
        except OSError as e:
            raise StorageError(f"{path}: {e.strerror}") from None
        finally:
            os.close(fd)

    async def aclose(self) -> None:
        for o in self._fds.values():
            _close(o.fd, o.local)
        self._fds.clear()
        self._mounts.close()
