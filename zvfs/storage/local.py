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

Versions (docs/reliability.md, "the contract"): a version is the file's (dev, ino, size,
mtime, ctime); reads check it with one fstat *after* the read. That proves the bytes came from
that version only if every change of the file changes the tag, and no change was being copied
while the version was looked at. Two things break it, both measured here: a write() updates the
timestamps *before* it copies the data (so a version looked at during a copy is already the new
tag, with old bytes), and on filesystems with coarse timestamps two writes in one tick leave
the tag alone (git's "racy" index problem). Hence `SETTLE`: a version whose mtime or ctime is
younger than that when it is looked at is *unsettled* (`Version.settled` False). An unsettled
index is read behind a barrier (lseek SEEK_DATA takes the inode lock shared on ext4, xfs, btrfs
and tmpfs, so it waits for a write being copied: measured, a 1 GiB write in progress held it
182-243 ms, a pread none) and never kept; chunks located in it carry the index bytes that
located them (`ChunkRef.evidence`), and `Pin.verify` re-reads those after the data, behind the
barrier, before the bytes are served. Once settled, no later write can keep the tag (its time
is at least SETTLE later), so reads need one fstat and nothing else. Linux 6.13+ gives every
change after a stat a fine-grained timestamp on ext4, xfs, btrfs and tmpfs (multigrain
timestamps: measured here, 0 of 2,000 write-after-stat pairs kept the mtime); the window is for
the copy in progress and for other filesystems.

An open file holds its version (`LocalPin`): the descriptor stays open while pinned, so a shard
replaced by rename keeps serving its old bytes to the handles that opened it (the replaced
file's ctime moves when it loses its last link: a pinned read accepts that change when the
link count is 0 and size, mtime and identity are unchanged).

Permission bits of versions and listing entries are the file's own read bits, narrowed by its
POSIX ACL, folded over every directory a reader searches on the way to it, symlinks followed
(storage/access.py, storage/walk.py): what a reader of the store can reach. What that costs:

* directories: the walk of a store directory (one lstat per component, a readlink per link, a
  stat and, where the group class has bits, a getxattr per directory searched) runs in a
  worker thread once per directory and is kept (`_walks`, `_facts`; `zvfs refresh` forgets
  them; a listing walks its directory afresh and teaches the walks of its subdirectories);
* files: nothing per open (`pin_now` is unchanged: one openat2 + fstat). When a Version is
  made (a file's first open, or a change: new size, mtime or ctime; an ACL change moves the
  ctime) the file's ACL is read from its open descriptor (one fgetxattr, on the loop for
  local filesystems; skipped where it cannot matter: no group bits, or the directories
  already stop group and others), and the descriptor's real path is compared with the real
  path of its directory's walk: a file reached through a link of its own (`c/1/1 ->
  ../../private/shard`) or a stale walk is walked afresh in a thread, once per descriptor
  (`_Open.via`), and gets no bits at all if that walk does not reach the file opened.

Measured (ext4, a store of 64 row directories of 64 shards, LocalStore directly, best of 11):
listing all 65 directories 20 -> 26 ms (+1.5 us an entry), the first `current` of all 4096
shards +2.7 us each (the ACL read).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import stat
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass

import trio

from ..errors import DirectoryTooLarge, ShardChanged, StorageError, TooManyOpen
from . import leases
from .access import (CLOSED, Dir, Subdirs, acl_of, acl_support, dir_facts, dir_of, narrowed, needs_acl, protected_symlinks,
                     reach, subdir_facts)
from .base import LISTED_ENTRY, LISTING_STEP, PROGRESS, Entries, Entry, ListingBudget, Pin, Store, Version, proof
from .dirwatch import DirectoryWatch
from .mounttable import FINE_TIMESTAMPS, LOCAL_FS_TYPES, MEMORY_FS_TYPES, MountTable
from .walk import Gate, Walked, join, resolve

log = logging.getLogger("zvfs.storage.local")

#: Worker threads per mount point: enough for parallel uncached disk reads, few enough that a
#: hung mount cannot pile up threads without bound.
THREADS_PER_MOUNT = 8
#: seconds between looks at a mount's thread queue by a load queued on it (`_queued`)
QUEUE_POLL = 0.1
#: read_version retries when the file changes under the read before giving up (EIO).
STABLE_READ_ATTEMPTS = 3
#: How old a file's last change (mtime or ctime) must be, when a version of it is looked at,
#: for that version to be *settled* (module docstring). 2 s: coarser than any timestamp
#: granularity of a local filesystem (FAT's 2 s; ext4 with 128-byte inodes and ext3: 1 s;
#: jiffies elsewhere) and far longer than one write() of a shard takes here (a 1 GiB write:
#: 0.21-0.29 s on ext4 and tmpfs). The cost of a longer window: a shard written less than this
#: long ago is read through a worker thread (~0.1 ms more per read) and its index is not kept.
SETTLE_NS = 2_000_000_000
#: Directory stats and reach masks remembered (per directory, per owner of files below it);
#: past it they are forgotten at once and walked again as used. ~500 bytes a directory
#: (60,000 row directories listed one by one: 29 MiB held at 1 << 16, 5 MiB at 1 << 14,
#: memory=2G, FUSE-free), so what they hold stays a small part of any memory budget.
DIRS_KEPT = 1 << 14
#: Subdirectories whose walks one listing teaches at most (a huge directory teaches none of
#: its own: they are walked when used).
CHILD_WALKS_KEPT = 1024
#: Directories whose numbered subdirectories' facts are kept as one set (`known_subdirs`: a
#: few bytes each, whatever the number of subdirectories)
SUBDIRS_KEPT = 4096
#: Numbered subdirectories that are symlinks walked one by one for such a set; past it the set
#: is closed to all but root (one log line)
SUBDIR_LINKS_WALKED = 1024

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SLOW = object()  # "ask a worker thread"


class _OpenHow(ctypes.Structure):  # struct open_how of openat2(2)
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


SYS_OPENAT2 = 437  # one number on every architecture (new syscalls share the generic table)
RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH, RESOLVE_CACHED = 0x04, 0x08, 0x20
AT_FDCWD = -100
_syscall = ctypes.CDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_HOW = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_CACHED | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
_HOW_ADDRESS, _HOW_SIZE = ctypes.addressof(_HOW), ctypes.sizeof(_HOW)


def _open_path_if_cached(root: int, path: bytes) -> int:
    """An O_PATH descriptor of `path` below directory `root` (nothing is opened: no FIFO or
    device open runs), from the kernel's caches only: `openat2(RESOLVE_CACHED |
    RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` fails with EAGAIN where the lookup would need I/O
    or revalidation (never waits, the open analogue of RWF_NOWAIT), ELOOP at a symlink, EXDEV
    on a way out of `root`; ENOSYS/EINVAL on kernels before 5.12. Below the store root's
    descriptor, not from /: the walk of every open's path check is the store's part only
    (5.6 -> ~3 us per open under four readers, measured in the walk)."""
    fd = _syscall(SYS_OPENAT2, root, path, _HOW_ADDRESS, _HOW_SIZE)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return fd


def _state(st: os.stat_result) -> tuple:
    """What tells one state of a file's bytes from another: `Version.size` and `Version.tag`."""
    return st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


_pack = struct.Struct("<5q").pack  # (the bytes of base.version_token)


def _matches(st: os.stat_result, v: Version) -> bool:
    """`st` is of version `v` (field by field: building the tuples of `_state` cost more than
    the fstat; once per read)."""
    tag = v.tag
    return (st.st_mtime_ns == tag[2] and st.st_ctime_ns == tag[3] and st.st_size == v.size
            and st.st_ino == tag[1] and st.st_dev == tag[0])


def _holds(o: "_Open", st: os.stat_result, v: Version) -> bool:
    """A pinned descriptor still holds version `v`: exactly the same state, or the state `v`
    had when the descriptor's read lease was taken, and the lease still holds (leases.py: a
    shard replaced by rename keeps serving its old handles; its unlink changed its ctime).
    (Not "the same file whose last link is gone" on its own: an in-place write before the
    rename over it changes its bytes with a state the check cannot tell from the old, and such
    a shard was seen serving new bytes under an old version.)"""
    return _matches(st, v) or (o.lease == (v.size, v.tag) and st.st_ino == v.tag[1] and st.st_dev == v.tag[0]
                               and leases.holds(o.fd))


#: tells apart the versions of directories changed within SETTLE (`listing_version`)
_UNSETTLED = itertools.count()


def _settled(st: os.stat_result) -> bool:
    """The file's last change is older than SETTLE (any filesystem)."""
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= SETTLE_NS


def version_of(st: os.stat_result, reach_bits: int = 0o777, settled: bool = False, own: int | None = None) -> Version:
    """`own`: the file's bits narrowed by its ACL (default: its mode bits)."""
    size, tag = _state(st)
    return Version(size, tag, st.st_mtime_ns, (stat.S_IMODE(st.st_mode) if own is None else own) & reach_bits,
                   st.st_uid, st.st_gid, settled or _settled(st))


def _acl_blocking(fd: int) -> bytes | None:
    """`acl_of` a dup'ed descriptor that it closes (worker thread)."""
    try:
        return acl_of(fd)
    finally:
        os.close(fd)


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


def _barrier(fd: int) -> None:
    """Wait until no write() of the file is being copied: lseek(SEEK_DATA) takes the inode lock
    shared on ext4, xfs, btrfs and tmpfs (a write holds it exclusively while it copies). A
    worker-thread call: it may wait as long as the write."""
    try:
        os.lseek(fd, 0, os.SEEK_DATA)
    except OSError:  # ENXIO: an empty file (or all hole); EINVAL: no SEEK_DATA here
        pass


def _read_blocking(fd: int, start: int, length: int | None, stable: bool) -> tuple[bytes, os.stat_result] | None:
    """A read in a worker thread, on a dup'ed descriptor that it closes. With `stable`, the
    bytes and the returned stat come from one unchanged state of the file (fstat before and
    after agree, no write being copied after the first: `_barrier`), retried a few times; None
    if the file kept changing."""
    try:
        for _ in range(STABLE_READ_ATTEMPTS):
            before = os.fstat(fd)
            if stable:
                _barrier(fd)
            off, n = _span(before.st_size, start, length)
            data = os.pread(fd, n, off)
            after = os.fstat(fd)
            if not stable or _state(before) == _state(after):
                return data, after
        return None
    finally:
        os.close(fd)


def _verify_blocking(fd: int, evidence: tuple) -> tuple[bool, os.stat_result]:
    """(whether the file still holds `evidence`, its stat afterwards), behind the barrier, on
    a dup'ed descriptor that it closes (a worker thread)."""
    try:
        _barrier(fd)
        same = all(proof(off, os.pread(fd, length, off)) == (off, length, digest) for off, length, digest in evidence)
        return same, os.fstat(fd)
    finally:
        os.close(fd)


def _process_budget() -> int:
    """Descriptors that the stores of one process keep open at most, together: a quarter of
    the soft RLIMIT_NOFILE (1024 on most desktops), so that a program reading several stores
    in-process (the fsspec front: 263 descriptors per store once every shard was read, 1,103
    in the test process) leaves the rest of the limit to itself."""
    import resource

    return max(64, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)


def _descriptor_room() -> int:
    """Shard descriptors all the stores of this process may hold open at once (cached, or
    pinned by open files): the soft RLIMIT_NOFILE less an eighth (at least 64) left for what
    reading them takes (a `dup` per read in a worker thread, O_PATH lookups, sockets, inotify).
    Past it an open of a file of one more shard is refused (`TooManyOpen`): an outside attacker
    holding one file of each of 20,000 shards ran the daemon out of descriptors, and every open
    and every threaded read then failed with EIO. Read at each new descriptor (one syscall
    beside an open): a limit changed while running (`prlimit`) counts at once."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft - max(64, soft // 8)


def use_descriptor_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard one (a daemon's start: many open files each
    pin a shard's descriptor; trio and pyfuse3 use epoll, so descriptors past 1024 are safe)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.debug("cannot raise RLIMIT_NOFILE to %d: %s", hard, e)


def _close(fd: int, local: bool) -> None:
    """Close on the loop for local filesystems; elsewhere in a thread of its own, not awaited:
    close(2) on FUSE sends a synchronous FLUSH, which a hung filesystem never answers."""
    leases.forget(fd)
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


@dataclass(slots=True)
class _Open:
    """A cached descriptor of a key: the file it reached, and how its I/O may be done."""

    fd: int
    ident: tuple[int, int]  # (st_dev, st_ino) of the file opened
    mount: str  # mount point of the file (its thread limiter)
    local: bool  # on a local filesystem: page-cached reads and fstat on the trio thread
    nowait: bool = True  # reads may be tried on the loop (cleared on EOPNOTSUPP of RWF_NOWAIT)
    memory: bool = False  # data in memory (tmpfs): plain pread on the loop
    fine: bool = False  # a change after a stat gets a new timestamp (FINE_TIMESTAMPS)
    version: Version | None = None  # the last Version handed out for this file
    path: bytes = b""  # the key's path below the root, encoded (the stat of every open looks it up)
    real: str = ""  # the real path of the file opened (no symlinks)
    via: tuple[Dir, ...] | None = None  # the directories a reader passes to it, when walked on its own
    pins: int = 0  # open files holding it (`LocalPin`): it is closed when the last lets go
    dropped: bool = False  # no longer the key's cached descriptor
    #: (size, tag) of the file when its read lease was taken (`_holds`); () none now, asked for
    #: again at the next pin (a writer had it open, or broke it); None: never granted here
    lease: tuple | None = None


class LocalPin(Pin):
    """One version of a local file, held open: reads come from the descriptor that version was
    read through (a replaced file keeps serving its old bytes) and must still find it."""

    __slots__ = ("_open",)

    def __init__(self, store: "LocalStore", key: str, o: _Open, version: Version):
        self.key, self.version = key, version  # (Pin.__init__ in line: once per open)
        self._store = store
        self._open = o
        o.pins += 1

    async def read(self, start: int, length: int, extent: int | None = None) -> bytes:
        return await self._store._read_pinned(self._open, self.key, start, length, self.version)

    def read_now(self, start: int, length: int) -> bytes | memoryview | None:
        return self._store._read_pinned_now(self._open, self.key, start, length, self.version)

    async def verify(self, evidence: tuple) -> Version | None:
        return await self._store._verify(self._open, self.key, evidence, self.version)

    def release(self) -> None:
        o, self._open = self._open, None
        if o is not None:
            o.pins -= 1
            if o.dropped and not o.pins:
                LocalStore.held -= 1
                _close(o.fd, o.local)


class LocalStore(Store):
    #: descriptors kept open by all the stores of this process (`_process_budget`)
    kept = 0
    #: shard descriptors open in all the stores of this process, kept or pinned (`_descriptor_room`)
    held = 0
    dir_bits = True
    names_are_file_names = True

    def __init__(self, root: str, max_open_files: int = 256, follow_symlinks: bool = False,
                 max_listing: int | None = None):
        self.root = os.path.abspath(root)
        self.listing_budget = ListingBudget(max_listing)
        self.display = self.root
        self.real_root = os.path.realpath(root)
        self._inside_prefix = self.real_root.rstrip("/") + "/"
        self.follow_symlinks = follow_symlinks
        self._fds: OrderedDict[str, _Open] = OrderedDict()
        self._max_open = max_open_files
        #: reads of shard bytes made, and their bytes (`zvfs stats`: backend requests, bytes)
        self.requests = 0
        self.bytes = 0
        self._mounts = MountTable()
        self._limiters: dict[str, trio.CapacityLimiter] = {}
        #: mount -> when a call in its threads last showed progress (`PROGRESS`) or returned
        self._moved: dict[str, float] = {}
        self._warned: set[str] = set()
        self._cached_opens = True  # openat2(RESOLVE_CACHED) works on this kernel
        self._scratch = memoryview(bytearray(1 << 20))  # RWF_NOWAIT target of reads up to 1 MiB
        self._root_fd = os.open(self.real_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # (`_lookup_cached`)
        root = os.fstat(self._root_fd)
        self._root_id = (root.st_dev, root.st_ino)  # the directory mounted (`_root_here`)
        #: the directories above the store root, and the root (a reader must search them all)
        self._forget_directories()
        self._watch = DirectoryWatch()  # (inotify only once a front looks for changes)

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
        going_on, progress, moved = PROGRESS.get(), None, self._moved
        if going_on is not None:
            if not limiter.available_tokens:
                await self._queued(mount, limiter, going_on)

            def shown() -> None:  # (the load's progress, which the loads queued on the mount share)
                going_on()
                moved[mount] = time.monotonic()

            progress = PROGRESS.set(shown)
        try:
            # abandon_on_cancel: a call stuck on a hung mount must not keep the daemon from exiting
            return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=True)
        finally:
            if progress is not None:
                PROGRESS.reset(progress)
            moved[mount] = time.monotonic()

    async def _queued(self, mount: str, limiter: trio.CapacityLimiter, going_on) -> None:
        """Wait for a thread of `mount` for a load that shows its progress (`PROGRESS`): the
        calls ahead of it that show theirs, or return, are its progress; a queue that does not
        move (every thread held on a hung mount) is not, so its waiters still give up after the
        patience. (Twelve listings of 100,000 names at once: the four queued behind the eight
        threads showed nothing and were EIO at the 5 s patience.)"""
        seen = self._moved.get(mount)
        while not limiter.available_tokens:
            await trio.sleep(QUEUE_POLL)
            if self._moved.get(mount) != seen:
                seen = self._moved.get(mount)
                going_on()

    def _real_path(self, key: str) -> str:
        """The path of `key` below the real root, as it reads (symlinks not resolved)."""
        path = self._inside_prefix + key if key else self.real_root
        return os.path.normpath(path) if "/." in path or "//" in path or path.endswith("/") else path

    def _relative(self, key: str) -> bytes:
        """The path of `key` below the store root's descriptor (`_lookup_cached`)."""
        return os.fsencode(os.path.normpath(key) if key else ".")

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
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise TooManyOpen(f"{path}: {e.strerror}") from None
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

    def _lookup_cached(self, key: str | bytes):
        """(O_PATH descriptor, its stat) of a key's plain path (no symlinks, so its mount is the
        one it names) from the kernel's caches only, never waiting; None when known absent (a
        cached negative entry); _SLOW when only a worker thread can tell."""
        if not self._cached_opens:
            return _SLOW
        try:
            pfd = _open_path_if_cached(self._root_fd, key if isinstance(key, bytes) else self._relative(key))
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

    def _open_cached(self, key: str, path: str):
        """`_open_blocking` on the trio thread where nothing can block (a path on a local
        filesystem, see `_lookup_cached`). Returns like `_open_blocking`, or _SLOW."""
        got = self._lookup_cached(key)
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
        if LocalStore.held >= _descriptor_room():
            raise TooManyOpen(f"{LocalStore.held} shard files held open, near the descriptor limit "
                              "(RLIMIT_NOFILE): more opens are refused until some close")
        path = self._real_path(key)
        point, fstype = self._mounts.mount_of(path)
        got = _SLOW
        if fstype in LOCAL_FS_TYPES and self._inside(path):
            got = self._open_cached(key, path)
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
        o = self._fds[key] = _Open(fd, (st.st_dev, st.st_ino), point, local, memory=fstype in MEMORY_FS_TYPES,
                                   fine=fstype in FINE_TIMESTAMPS, real=real)
        if local:
            self._lease(o)
        LocalStore.kept += 1
        LocalStore.held += 1
        if len(self._fds) > self._max_open or (LocalStore.kept > _process_budget() and len(self._fds) > 1):
            self._drop(*next(iter(self._fds.items())))
        return o, st

    @staticmethod
    def _lease(o: _Open) -> None:
        """A read lease on the descriptor (leases.py), and the state the file had then."""
        got = leases.take(o.fd)
        o.lease = _state(os.fstat(o.fd)) if got else () if got is False else None

    def _lease_again(self, o: _Open) -> None:
        """A lease let go of for a writer (or refused while one had the file open) is asked for
        again: one open for writing must not cost the shard its lease for good."""
        if o.lease is not None and not leases.holding(o.fd):
            self._lease(o)

    def _drop(self, key: str, o: _Open) -> None:
        """`o` stops being the key's descriptor; it is closed once no open file pins it."""
        if self._fds.get(key) is o:
            del self._fds[key]
            LocalStore.kept -= 1
            o.dropped = True
            if not o.pins:
                LocalStore.held -= 1
                _close(o.fd, o.local)

    async def _stat(self, key: str, o: _Open) -> os.stat_result | None:
        """A fresh stat of the path of `key` (whose descriptor is `o`); None if there is none.
        On the loop only from the kernel's caches: a path that changed into a symlink to a
        hung mount must not freeze the loop."""
        got = self._lookup_cached(key) if o.local else _SLOW
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

    # -- versions and who may read them ----------------------------------------------------

    async def _version(self, key: str, st: os.stat_result, barred: bool = False) -> Version:
        """The Version of `st`, reusing the one last made for `key` while the file is
        unchanged and settled (building a frozen dataclass costs more than the stat). `barred`:
        `st` was taken behind the barrier, no write in progress, which settles the version at
        once where the filesystem's timestamps are fine (`_Open.fine`)."""
        o = self._fds.get(key)
        if o is not None and o.version is not None and o.version.settled and _matches(st, o.version):
            return o.version
        same = o is not None and (st.st_dev, st.st_ino) == o.ident
        fine = barred and same and o.fine
        bits, own = await self._file_bits(key, st, o if same else None)
        v = version_of(st, bits, fine, own)
        if same:
            o.version = v
        return v

    async def _file_bits(self, key: str, st: os.stat_result, o: _Open | None) -> tuple[int, int]:
        """(the classes of readers that reach the file, its own bits narrowed by its ACL) for
        `st`, a stat of the file `key` names; `o`: the descriptor `st` is of, if known. A file
        whose real path is its directory's (walked, remembered) real path plus its name is
        reached through that directory; any other (a link of its own, a walk gone stale, no
        descriptor) is walked afresh, and if that walk does not reach this very file, nobody
        but root reads it."""
        mode = stat.S_IMODE(st.st_mode)
        dirs = None if o is None else o.via
        if o is not None and dirs is None:
            parent, _, name = key.rpartition("/")
            real_parent = await self._walk_to(parent)
            if real_parent is not None and o.real == join(real_parent, name):
                bits = await self._reach(parent, st.st_uid, st.st_gid)
                return bits, await self._own_bits(mode, bits, st, o)
        if dirs is None:
            walked = await self._walk(key)
            if walked.st is None or (walked.st.st_dev, walked.st.st_ino) != (st.st_dev, st.st_ino):
                return 0, mode
            dirs = self._above + tuple(self._fact(g, walked.facts) for g in walked.gates)
            if o is None:
                return reach(dirs, st.st_uid, st.st_gid), walked.own if walked.st.st_ctime_ns == st.st_ctime_ns else mode & 0o700
            o.via = dirs
        bits = reach(dirs, st.st_uid, st.st_gid)
        return bits, await self._own_bits(mode, bits, st, o)

    async def _own_bits(self, mode: int, bits: int, st: os.stat_result, o: _Open) -> int:
        """The file's bits narrowed by its ACL, read from its descriptor (once per Version: an
        ACL change moves the ctime); not read where it cannot matter (no group bits: the
        kernel does not look; or group and others stopped above anyway)."""
        if not needs_acl(mode) or not mode & bits & 0o077:
            return mode
        if o.dropped and not o.pins:  # closed while the walk awaited: its number may be another file's
            return mode & 0o700
        acl = acl_of(o.fd) if o.local else await self._in_thread(o.mount, _acl_blocking, os.dup(o.fd))
        return narrowed(mode, acl, st.st_uid)

    async def _reach(self, prefix: str, uid: int, gid: int) -> int:
        """`access.reach` of the directories a reader searches to look a name up in store
        directory `prefix`, for a file owned by uid:gid (remembered per directory and owner)."""
        found = self._reaches.get((prefix, uid, gid))
        if found is None:
            dirs = await self._dirs_to(prefix)
            if dirs is None:  # (gone meanwhile: closed, and not remembered)
                return reach((CLOSED,), uid, gid)
            found = reach(dirs, uid, gid)
            if len(self._reaches) >= DIRS_KEPT:
                self._reaches.clear()
            self._reaches[(prefix, uid, gid)] = found
        return found

    def _fact(self, gate: Gate, fresh: dict[str, Dir] | None = None) -> Dir:
        if not isinstance(gate, str):
            return gate
        got = fresh.get(gate) if fresh is not None else None
        return got if got is not None else self._facts.get(gate, CLOSED)

    async def _dirs_to(self, prefix: str) -> tuple[Dir, ...] | None:
        """Every directory a reader searches to look a name up in store directory `prefix`,
        from / down, symlinks followed, `prefix` itself last (its walk is remembered; taken in
        a worker thread when not known); None when it cannot be reached."""
        w = self._walks.get(prefix) or self._walk_cached(prefix)
        if w is None or any(isinstance(g, str) and g not in self._facts for g in (*w[1], w[0])):
            walked = await self._walk(prefix)
            if walked.real is None or not stat.S_ISDIR(walked.st.st_mode):
                return None
            return self._above + tuple(self._fact(g, walked.facts) for g in (*walked.gates, walked.real))
        real, gates = w
        return self._above + tuple(self._fact(g) for g in (*gates, real))

    async def _walk_to(self, prefix: str) -> str | None:
        """The real path of store directory `prefix` (its walk remembered), None if unreachable."""
        w = self._walks.get(prefix) or self._walk_cached(prefix)
        if w is None:
            await self._walk(prefix)
            w = self._walks.get(prefix)
        return None if w is None else w[0]

    def _walk_cached(self, prefix: str) -> tuple[str, tuple[Gate, ...]] | None:
        """The walk of store directory `prefix` on the loop, where it needs no thread: its
        nearest known ancestor's walk has no link (its real path is its lexical one), the rest
        of the way is a plain path from the kernel's caches (`_lookup_cached`: no symlink, no
        I/O), on a local filesystem; each directory's stat from its O_PATH descriptor, its ACL
        read through /proc/self/fd where the group class has bits. None: ask a worker thread."""
        if not self._cached_opens:
            return None
        parts = prefix.split("/")
        known = len(parts) - 1
        while known > 0 and "/".join(parts[:known]) not in self._walks:
            known -= 1
        above = "/".join(parts[:known])
        real, gates = self._walks[above]
        if real != self._real_path(above):  # a link on the way: only a walk can tell
            return None
        got: list[tuple[str, str, tuple[Gate, ...], Dir]] = []
        for i in range(known, len(parts)):
            key = "/".join(parts[:i + 1])
            gates, real = gates + (real,), join(real, parts[i])
            if self._mounts.mount_of(real)[1] not in LOCAL_FS_TYPES:
                return None
            found = self._lookup_cached(key)
            if found is None or found is _SLOW:
                return None
            pfd, st = found
            try:
                if not stat.S_ISDIR(st.st_mode):
                    return None
                acl = None
                if needs_acl(stat.S_IMODE(st.st_mode)):
                    acl = acl_of(f"/proc/self/fd/{pfd}", follow_symlinks=True)
                got.append((key, real, gates, dir_of(st, acl)))
            finally:
                os.close(pfd)
        self._learn(Walked(real, prefixes=[(key, r, g) for key, r, g, _ in got], facts={r: d for _, r, _, d in got}))
        return self._walks.get(prefix)

    async def _walk(self, key: str) -> Walked:
        """A fresh walk of `key` from the store root (worker thread); what it found about
        directories is remembered."""
        walked = await self._in_thread(self._lexical_mount(key), resolve, self.real_root,
                                       key.split("/") if key else [], "", self._protected)
        self._learn(walked)
        return walked

    def _learn(self, walked: Walked) -> None:
        """Remember the walks and directory facts of `walked` (fresher than what is kept: a
        fact that changed makes every remembered reach be folded anew)."""
        if walked.real is None and not walked.prefixes:
            return
        if len(self._walks) + len(walked.prefixes) > DIRS_KEPT or len(self._facts) + len(walked.facts) > DIRS_KEPT:
            # forgotten, but for the directories the views show (and the ones on their walks):
            # those forgotten were compared as gone and back, a change that dropped every cache
            kept = {key: w for key, w in self._walks.items() if key == "" or w[0] in self._shown}
            keep = {self.real_root, *self._shown, *(g for _, gates in kept.values() for g in gates if isinstance(g, str))}
            self._walks = kept
            self._facts = {path: d for path, d in self._facts.items() if path in keep}
            self._reaches.clear()
            self._subdirs.clear()
            self.generation += 1
        changed = learned = False
        for key, real, gates in walked.prefixes:
            old = self._walks.get(key)
            if old != (real, gates):
                changed |= old is not None
                learned = True
                self._walks[key] = (real, gates)
        for path, d in walked.facts.items():
            if path == self.real_root and not self._root_here:  # (shown closed: `_root_is_here`)
                continue
            old = self._facts.get(path)
            if old != d:
                changed |= old is not None
                learned = True
                self._facts[path] = d
        if changed:
            self._reaches.clear()
        if learned:
            self.generation += 1

    def _forget_directories(self) -> None:
        self.generation += 1
        self._protected = protected_symlinks()
        #: the directories above the store root (a reader must search them all) ...
        parts = self.real_root.strip("/").split("/") if self.real_root != "/" else []
        self._above_paths = tuple("/" + "/".join(parts[:i]) for i in range(len(parts)))
        self._above: tuple[Dir, ...] = tuple(dir_facts(p) for p in self._above_paths)
        #: ... and below it: real directory path -> Dir (ACL folded in); store directory -> (its
        #: real path, the gates on the way: access.walk)
        self._root_here = self._root_is_here()
        self._facts: dict[str, Dir] = {self.real_root: dir_facts(self.real_root) if self._root_here else CLOSED}
        self._walks: dict[str, tuple[str, tuple[Gate, ...]]] = {"": (self.real_root, ())}
        self._reaches: dict[tuple[str, int, int], int] = {}  # (directory, owner, group) -> `reach`
        #: (real directory path, names) -> (`subdir_facts`, the symlinks among them whose walks
        #: reach a directory, None: too many) (`known_subdirs`), watched as `_facts` are
        self._subdirs: dict[tuple[str, range], tuple[Subdirs, tuple[str, ...] | None]] = {}
        self._dir_ctimes: dict[str, int] = {}  # real directory path -> settled ctime its facts were checked at
        self._looked: int | None = None  # the `generation` of the last look (`directories_changed`)
        self.look_cost = 0.0  # processor seconds its thread took (`OpenSource.watch_permissions` spaces looks by it)
        self._mounts_looked: int | None = None  # the mount table's `version` then
        #: real paths of the directories the views show (lexical where none was found), with
        #: what `info` found there (CLOSED: none)
        self._shown: dict[str, Dir] = {}

    def _root_is_here(self) -> bool:
        """Whether the store root's path still names the directory mounted. A store moved
        away (into a directory closed to others, say), deleted, or replaced by another
        directory is shown closed to all but root (`_facts`): its descriptors would still
        reach it (an outside attacker read every chunk of a store moved into a 0700 directory
        through the mount and `zvfs serve`), and what its path names now is not what the
        views were made of. Moved back, it is shown as before."""
        try:
            st = os.lstat(self.real_root)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._root_id

    async def directories_changed(self) -> bool:
        """Whether the owner, group or bits (ACL folded in) of a directory the store
        remembers (the ones above the root, the root, and every one walked since) changed
        since they were read: what `zvfs refresh` reads again, looked at without it (a
        worker thread; inotify names the directories to look at, dirwatch.py, and each of
        those costs an lstat, the ACL read again only where the ctime moved, which every
        chmod, chown and ACL change does, since a look that found it settled: as for files, a
        ctime younger than SETTLE may be shared by a later change). A directory gone is no
        change (nothing below it opens), unless a view shows it (`info`: an array moved into a
        closed directory, whose metadata the view still holds, is then shown closed); one made
        again is compared; the store root moved,
        gone or replaced (or back) is a change (`_root_is_here`). (2,421 directories: an
        outside attacker measured the idle daemon at 4-5% of a core with a getxattr each, and
        3-6% with an lstat each; with inotify an idle look stats nothing.)"""
        now, mounts = self.generation, self._mounts.version()
        self.look_cost = 0.0
        # shown directories whose facts are not what a view shows of them (gone when `info`
        # looked, or learned since by a lookup's walk): compared with what the view shows, at
        # every look; one learned otherwise makes the look. (An array made again while a
        # refresh found it gone was learned by the lookups that followed, compared with that,
        # and stayed shown closed: CI, twice.)
        stale = [(p, d) for p, d in self._shown.items() if self._facts.get(p) != d]
        learned = any(p in self._facts for p, _ in stale)
        if now == self._looked and mounts == self._mounts_looked and not learned and self._watch.quiet():  # (an idle mount: no thread, no stat)
            return False
        remount = mounts != self._mounts_looked  # (a mount over a directory hides the inode watched)
        paths = (*self._above_paths, *self._facts)
        known = (*self._above, *self._facts.values())
        shown = frozenset(self._shown)
        subdirs = tuple(self._subdirs.items())
        walks, inside = self._walks, self._inside_prefix
        seen = self._dir_ctimes
        if len(seen) > 2 * DIRS_KEPT:
            seen.clear()
        unwatched = self._mounts.stalling_points()

        def changed() -> bool:
            if remount:  # every directory compared, and watched again
                self._watch.close()
            compare = self._watch.to_compare(paths, unwatched)
            if self._root_is_here() != self._root_here:
                return True
            if compare is not None:  # a walked name that a symlink led elsewhere, named by an event:
                # the link removed, replaced (by a directory too) or retargeted by a rename over it
                for path in self._watch.evented:
                    w = walks.get(path[len(inside):]) if path.startswith(inside) else None
                    if w is not None and w[0] != path:
                        return True
            for path, was in zip(paths, known):
                if compare is not None and path not in compare:
                    continue
                if path == self.real_root and not self._root_here:  # (shown closed: `_root_is_here`)
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    if path in shown and was != CLOSED:
                        return True
                    continue
                if seen.get(path) == st.st_ctime_ns:
                    continue
                if dir_facts(path, st) != was:
                    return True
                if _settled(st):
                    seen[path] = st.st_ctime_ns
            if any(dir_facts(path) != was for path, was in stale):  # (gone: CLOSED)
                return True
            # numbered subdirectories kept as a set: compared when their parent is (new, polled
            # or named by an event), or an event names one of them (a watch on a directory
            # reports its entries' chmod, chown and ACL changes, and their replacement), and at
            # every look where nothing is watched (not for a walk of one new since: a listing
            # of 4,100 shards made each look scan their 4,100 row directories again)
            named = None if compare is None else compare | {p.rpartition("/")[0] for p in self._watch.evented}
            return any((named is None or real in named) and subdir_facts(real, names, unwatched) != scan
                       for (real, names), (scan, _) in subdirs)

        def timed() -> bool:
            began = time.thread_time()
            try:
                return changed()
            finally:
                self.look_cost = time.thread_time() - began

        found = await self._in_thread(self._lexical_mount(""), timed)
        self._looked, self._mounts_looked = now, mounts
        return found

    def _searched(self, key: str) -> list[Dir] | None:
        """From the walks and facts kept (no I/O): the directories a reader searches to reach
        store directory `key`, from / down, itself last; None if not known."""
        w = self._walks.get(key)
        own = None if w is None else self._facts.get(w[0])
        if own is None:
            return None
        path = list(self._above)
        for g in w[1]:
            if isinstance(g, str):
                g = self._facts.get(g)  # type: ignore[assignment]
                if g is None:
                    return None
            path.append(g)  # type: ignore[arg-type]
        path.append(own)
        return path

    def known_dir(self, key: str) -> tuple[int, int, int] | None:
        """From the walks and facts kept (no I/O): the directory's facts, its bits less the
        classes the directories searched on the way to it stop (as `info` shows it)."""
        path = self._searched(key)
        if path is None:
            return None
        uid, gid, mode = path.pop()
        return uid, gid, mode & reach(path, uid, gid)

    def known_subdirs(self, key: str, names: range) -> list[Dir] | None:
        """`known_dir` of the subdirectories of store directory `key` named by a number in
        `names`, each distinct one once, from what `learn_subdirs` kept (no I/O); None if not
        known."""
        path = self._searched(key)
        kept = None if path is None else self._subdirs.get((self._walks[key][0], names))
        if kept is None:
            return None
        (kids, _), links = kept
        found = [(uid, gid, mode & reach(path, uid, gid)) for uid, gid, mode in kids]  # type: ignore[arg-type]
        if links is None:
            return [*found, CLOSED]
        for name in links:  # (their own walks: the target's directories, as the kernel follows them)
            linked = self.known_dir(f"{key}/{name}" if key else name)
            if linked is None:
                return None
            found.append(linked)
        return found

    async def learn_subdirs(self, key: str, names: range) -> list[Dir] | None:
        """`known_subdirs`, from one scan of `key` when not known (a worker thread; a stat of
        each entry, not a walk of each subdirectory: a chunk directory of the N5 view stands for
        every row directory of an array, and arrays have tens of thousands); None when `key` is
        not a directory. What it finds is kept and watched (`directories_changed`)."""
        found = self.known_subdirs(key, names)
        if found is not None or await self.learn_dir(key) is None:
            return found
        w = self._walks.get(key)
        if w is None:
            return None
        scan = await self._in_thread(self._lexical_mount(key), subdir_facts, w[0], names, self._mounts.stalling_points())
        if scan is None:
            return None
        links = scan[1]
        reached: tuple[str, ...] | None = None
        if len(links) > SUBDIR_LINKS_WALKED:
            self._warn_once(f"links {w[0]}", f"{w[0]}: more than {SUBDIR_LINKS_WALKED} row directories are symlinks: "
                                             "the N5 directories that span them are shown closed to all but root")
        else:  # a link walked to a directory counts as that directory; one that leads nowhere
            # (outside the store, dangling, to a file) lists nothing, as in the store's listings
            reached = tuple([n for n in links if await self.learn_dir(f"{key}/{n}" if key else n) is not None])
        if len(self._subdirs) >= SUBDIRS_KEPT:
            self._subdirs.clear()
        self._subdirs[w[0], names] = scan, reached
        self.generation += 1
        return self.known_subdirs(key, names)

    async def learn_dir(self, key: str) -> tuple[int, int, int] | None:
        """Walked when not known: on the loop from the kernel's caches where it can
        (`_walk_cached`), else in a worker thread; what it finds is kept and watched
        (`directories_changed`)."""
        found = self.known_dir(key)
        if found is None and await self._walk_to(key) is not None:
            found = self.known_dir(key)
        return found

    def forget_directories(self) -> None:
        """`zvfs refresh`: directory permissions, ACLs and symlinks are read again (and the
        bits of files already open with them)."""
        self._forget_directories()
        self._watch.close()
        for o in self._fds.values():
            o.via = o.version = None

    def root_mode(self) -> tuple[int, int, int]:
        """(mode, uid, gid) of the store root as a reader sees it: its read and search bits
        (ACL folded in), less the readers that a directory above it stops."""
        uid, gid, mode = self._facts.get(self.real_root) or dir_facts(self.real_root)
        return mode & reach(self._above, uid, gid), uid, gid

    # -- reads ---------------------------------------------------------------------------

    def _count(self, data: bytes) -> None:
        self.requests += 1
        self.bytes += len(data)

    def _pread_cached(self, o: _Open, off: int, n: int) -> bytes | memoryview | None:
        """`n` bytes at `off` if the page cache holds them (a short result at the end of the
        file), as a view of the scratch buffer (valid until the next read); None when the data
        needs a disk read or RWF_NOWAIT is not supported."""
        if o.memory:
            data = os.pread(o.fd, n, off)
            self.requests += 1
            self.bytes += len(data)
            return data
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
        self.requests += 1
        self.bytes += got
        return buf[:got]

    async def _read(self, key: str, start: int, length: int | None, stable: bool,
                    after: bool) -> tuple[bytes | None, os.stat_result | None]:
        """Bytes of `key` and, with `after`, a stat taken after the read (with `stable`, the
        stat of the one state the bytes came from: a file changed less than SETTLE ago is
        read in a worker thread, behind the barrier)."""
        o, _ = await self._get(key)
        if o is None:
            return None, None
        return await self._read_open(o, key, start, length, stable, after)

    async def _read_open(self, o: _Open, key: str, start: int, length: int | None, stable: bool,
                         after: bool) -> tuple[bytes | None, os.stat_result | None]:
        try:
            if o.local and o.nowait:
                # (a stat first where the length must be known, or bounded: a read of "at most
                # 64 MiB" of a 1 KiB file must not take a 64 MiB buffer)
                sized = stable or start < 0 or length is None or length > len(self._scratch)
                before = os.fstat(o.fd) if sized else None
                if not stable or _settled(before):
                    off, n = (start, length) if before is None else _span(before.st_size, start, length)
                    n = n if before is None else max(0, min(n, before.st_size - off))
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
        self._count(got[0])
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
        """Read from the file the path names now (an index is read for the version current at
        this moment: a descriptor cached from before a replace would give the old file's)."""
        o = self._fds.get(key)
        if o is not None:
            st = await self._stat(key, o)
            if st is None or (st.st_dev, st.st_ino) != o.ident:
                self._drop(key, o)
        o, _ = await self._get(key)
        if o is None:
            return None, None
        data, st = await self._read_open(o, key, start, length, True, True)
        return data, None if st is None else await self._version(key, st, barred=not _settled(st))

    # -- pinned versions (open files) -----------------------------------------------------------

    def pin_now(self, key: str) -> LocalPin | None:
        """The common case of `pin`, with no await (`current` and its awaits cost 2-3 us more
        per open): a cached descriptor that the path, looked up from the kernel's caches, still
        names, at its last version (if that was settled)."""
        o = self._fds.get(key)
        if o is None or not o.local or o.version is None or not o.version.settled:
            return None
        self._lease_again(o)
        if not o.path:
            o.path = self._relative(key)
        pfd = _syscall(SYS_OPENAT2, self._root_fd, o.path, _HOW_ADDRESS, _HOW_SIZE)  # (`_lookup_cached`, in line)
        if pfd < 0:
            return None
        try:
            st = os.fstat(pfd)
        finally:
            os.close(pfd)
        return LocalPin(self, key, o, o.version) if st.st_ino == o.ident[1] and st.st_dev == o.ident[0] and _matches(st, o.version) else None

    async def pin(self, key: str, known: Version | None = None) -> LocalPin | None:
        """The key's file as it is now, held open. With `known` (a version this request has
        just read the key at), the cached descriptor of that file is taken if it still holds
        that version (one fstat, no path lookup). (Its inode number alone is not enough: a
        filesystem gives a freed inode's number to the next new file, and an outside
        attacker's 2 ms rename writer had a chunk located in one file pinned to the next one
        of that number: 37-73 EIO per 20 s through handles opened before a rename.)"""
        o = self._fds.get(key)
        if o is not None and o.local:
            self._lease_again(o)
        if known is not None and o is not None and o.ident == known.tag[:2] and _holds(o, await self._fstat(o), known):
            return LocalPin(self, key, o, known)
        version = await self.current(key)
        o = self._fds.get(key)
        if version is None or o is None or o.ident != version.tag[:2]:  # gone, or replaced meanwhile
            return None if version is None else await self.pin(key)
        return LocalPin(self, key, o, version)

    def _read_pinned_now(self, o: _Open, key: str, start: int, length: int, v: Version) -> bytes | memoryview | None:
        if not (o.local and o.nowait) or not length:
            return None
        try:
            data = self._pread_cached(o, start, length)
            if data is None or len(data) != length:
                return None
            st = os.fstat(o.fd)
        except OSError as e:
            raise StorageError(f"{self._path(key)}: {e.strerror}") from None
        if not _holds(o, st, v):
            raise ShardChanged(key)
        return data

    async def _read_pinned(self, o: _Open, key: str, start: int, length: int, v: Version) -> bytes:
        now = self._read_pinned_now(o, key, start, length, v)
        if now is not None:
            return bytes(now)
        try:
            data, st = await self._in_thread(o.mount, _read_blocking, os.dup(o.fd), start, length, False)
        except OSError as e:
            raise StorageError(f"{self._path(key)}: {e.strerror}") from None
        self._count(data)
        if not _holds(o, st, v):
            raise ShardChanged(key)
        return data

    async def _verify(self, o: _Open, key: str, evidence: tuple, v: Version) -> Version | None:
        try:
            same, st = await self._in_thread(o.mount, _verify_blocking, os.dup(o.fd), evidence)
        except OSError as e:
            raise StorageError(f"{self._path(key)}: {e.strerror}") from None
        if not same or not _holds(o, st, v):
            return None
        settled = _settled(st) or o.fine and _matches(st, v)  # (behind the barrier)
        return Version(v.size, v.tag, v.mtime_ns, v.mode, v.uid, v.gid, True) if settled else v

    # -- what a key is now ---------------------------------------------------------------

    async def current(self, key: str) -> Version | None:
        """A stat of the path (see `_stat`): the same file as the cached
        descriptor gives its current version (an in-place rewrite shows as new size and
        times); another file (atomic replace) or none (deleted) drops the stale descriptor."""
        o = self._fds.get(key)
        if o is not None:
            st = await self._stat(key, o)
            if st is not None and (st.st_dev, st.st_ino) == o.ident:
                return await self._version(key, st)
            self._drop(key, o)
        o, st = await self._get(key)
        if o is None:
            return None
        return await self._version(key, st or await self._fstat(o))  # no st: another task's open

    async def size(self, key: str) -> int | None:
        o, st = await self._get(key)
        if o is None:
            return None
        return (st or await self._fstat(o)).st_size

    async def info(self, key: str) -> Entry | None:
        """One name (a file or a directory) as a listing would give it, from one stat. A
        directory asked for (a view shows it), or a name not found, is followed by
        `directories_changed` when it goes or comes back."""
        if not key:
            mode, uid, gid = self.root_mode()
            st = os.fstat(self._root_fd)  # (the directory mounted, wherever it is now)
            return Entry("", True, 0, mode, st.st_mtime_ns, uid, gid)
        walked = await self._walk(key)  # (afresh: the views' directories, when a store is opened)
        st = walked.st
        if st is None:
            self._shown[self._real_path(key)] = CLOSED
        elif stat.S_ISDIR(st.st_mode):  # (by its real path: one below a symlink compared as itself)
            self._shown[walked.real] = walked.facts.get(walked.real, CLOSED)  # type: ignore[index]
        if st is None or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or not self._inside(walked.real):
            return None
        bits = reach(self._above + tuple(self._fact(g, walked.facts) for g in walked.gates), st.st_uid, st.st_gid)
        is_dir = stat.S_ISDIR(st.st_mode)
        return Entry(key.rpartition("/")[2], is_dir, 0 if is_dir else st.st_size, walked.own & bits,
                     st.st_mtime_ns, st.st_uid, st.st_gid,
                     None if is_dir else _pack(st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))

    # -- listings ------------------------------------------------------------------------

    async def list(self, prefix: str) -> Entries | None:
        got = await self._in_thread(self._lexical_mount(prefix), self._list_blocking, prefix,
                                    self._mounts.stalling_points())
        if got is None:
            return None
        entries, learned = got
        self._learn(learned)
        return entries

    async def listing_version(self, prefix: str) -> tuple:
        """The directory as one stat shows it (device, inode, mtime, ctime: every entry made,
        removed or renamed in it moves both; a symlink retargeted shows another directory); ()
        when it is not one. A directory changed within SETTLE of now has a version equal to no
        other: a change within the timestamp tick of the stat taken before a listing would not
        move its times (the racy-git problem, as for files), so its listing is made again."""
        return await self._in_thread(self._lexical_mount(prefix), self._listing_version, prefix)

    async def may_hold(self, key: str) -> bool:
        return await self._in_thread(self._lexical_mount(key), os.path.lexists, self._path(key))

    def _listing_version(self, prefix: str) -> tuple:
        try:
            st = os.stat(self._path(prefix))
        except OSError:
            return ()
        if not stat.S_ISDIR(st.st_mode):
            return ()
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) + (() if _settled(st) else (next(_UNSETTLED),))

    def _list_blocking(self, prefix: str, stalling: frozenset[str]) -> tuple[Entries, Walked] | None:
        """Entries of a directory, and what the listing learned of directories (worker thread):
        the walk of the listed one, taken afresh, and of its subdirectories. Left out: special
        files (not keys), entries that lead outside the store (unless follow_symlinks), and
        directories that are the listed directory or one of the directories on the way down
        to it (a symlink loop such as `junk/a -> .` would otherwise make `find` and `cp -r`
        run forever). A mount point of a filesystem that may stall is listed without a stat of
        its root (that stat would hold this thread, and with it the listings of the mount
        above, for as long as the filesystem hangs): a directory without mode and time. Modes
        are narrowed by each entry's ACL and folded over the directories a reader searches to
        reach the listed one, symlinks followed (and, for an entry that is a link, over the
        ones its target's walk searches)."""
        path = self._path(prefix)
        going_on = PROGRESS.get()
        walked = resolve(self.real_root, prefix.split("/") if prefix else [], "", self._protected)
        try:
            fd = os.open(path, OPEN_FLAGS | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"{path}: {e.strerror}") from None
        taken = owed = 0  # bytes of this listing counted in `listing_budget`, and not yet
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not self._inside(real):
                self._warn_once(path, f"{path}: leads outside the store (to {real}); not listed without -o follow_symlinks")
                return None
            st_dir = os.fstat(fd)
            acl, acls = acl_support(fd)
            listed = dir_of(st_dir, acl)
            if walked.real == real and walked.st is not None and (walked.st.st_dev, walked.st.st_ino) == (st_dir.st_dev, st_dir.st_ino):
                walked.facts[real] = listed
                gates = walked.gates
                above = self._above + tuple(self._fact(g, walked.facts) for g in gates) + (listed,)
            else:  # changed between the walk and the open: nothing but root reads through it now
                gates, above, walked = None, (CLOSED,), Walked(None)
            parts = prefix.split("/") if prefix else []
            ancestors = set()
            for i in range(len(parts) + 1):
                st = os.stat(self._path("/".join(parts[:i])))
                ancestors.add((st.st_dev, st.st_ino))
            reaches: dict[tuple[int, int], int] = {}
            out = Entries()
            inner = gates + (real,) if gates is not None else None  # (the gates of the entries)
            with os.scandir(fd) as it:
                for de in it:
                    full = join(real, de.name)
                    if full in stalling:
                        out.add(de.name, True, 0)
                        continue
                    if de.is_symlink():
                        name = f"{path}/{de.name}"
                        w = None if inner is None else resolve(real, [de.name], prefix, self._protected, inner, walked.facts)
                        if w is not None and w.real is not None and not self._inside(w.real):
                            self._warn_once(name, f"{name}: leads outside the store; not listed without -o follow_symlinks")
                            continue
                        st = None if w is None or w.real is None else w.st
                        if st is None:
                            if inner is None:  # (the walk above failed: judged as before, shown closed)
                                try:
                                    st = os.stat(full)
                                except OSError:
                                    continue
                                if not self._inside(os.path.realpath(full)):
                                    continue
                            else:
                                continue  # dangling, a loop, or gone meanwhile
                    else:
                        w = None
                        try:
                            st = de.stat(follow_symlinks=False)
                        except OSError:
                            continue  # gone meanwhile
                    is_dir = stat.S_ISDIR(st.st_mode)
                    owed += LISTED_ENTRY + len(de.name)
                    if owed >= LISTING_STEP:
                        self.listing_budget.take(f"{path}: a directory of more than {len(out):,} entries", taken, owed)
                        taken, owed = taken + owed, 0
                        if going_on is not None:
                            going_on()
                    if is_dir and (st.st_dev, st.st_ino) in ancestors:
                        name = f"{path}/{de.name}"
                        self._warn_once(name, f"{name}: leads back to a directory above it (a loop); not listed")
                        continue
                    if not is_dir and not stat.S_ISREG(st.st_mode):
                        continue
                    own = mode = st.st_mode & 0o777
                    if w is not None and w.real is not None:  # a link: its own walk
                        bits = reach(self._above + tuple(self._fact(g, w.facts) for g in w.gates), st.st_uid, st.st_gid)
                        own = w.own
                        if is_dir and len(walked.prefixes) < CHILD_WALKS_KEPT:
                            walked.prefixes.append((f"{prefix}/{de.name}" if prefix else de.name, w.real, w.gates))
                            walked.facts[w.real] = w.facts[w.real]
                    else:
                        owner = (st.st_uid, st.st_gid)
                        bits = reaches.get(owner)
                        if bits is None:
                            bits = reaches[owner] = reach(above, *owner)
                        # the entry's ACL, where it can narrow what is shown (access.needs_acl)
                        if mode & 0o070 and (is_dir or mode & bits & 0o077) and (acls or st.st_dev != st_dir.st_dev):
                            acl = acl_of(full)
                            if acl is not None:
                                own = narrowed(mode, acl, st.st_uid)
                        if is_dir and inner is not None and len(walked.prefixes) < CHILD_WALKS_KEPT:
                            walked.prefixes.append((f"{prefix}/{de.name}" if prefix else de.name, full, inner))
                            walked.facts[full] = (st.st_uid, st.st_gid, own)
                    out.add(de.name, is_dir, 0 if is_dir else st.st_size, own & bits, st.st_mtime_ns,
                            st.st_uid, st.st_gid, None if is_dir else _pack(st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
            return out, walked
        except (FileNotFoundError, NotADirectoryError):
            return None  # (removed or replaced while listed: an outside attacker's EIO, ENOENT before the listing)
        except OSError as e:
            raise StorageError(f"{path}: {e.strerror}") from None
        except DirectoryTooLarge:
            out = None  # (its traceback keeps this frame while it is handled: not the entries; else the
            raise  # next listing of the directory held two listings at once: 118 -> 187 MiB)
        finally:
            os.close(fd)
            if taken:
                self.listing_budget.give_back(taken)

    async def aclose(self) -> None:
        for o in self._fds.values():
            _close(o.fd, o.local)
        LocalStore.kept -= len(self._fds)
        LocalStore.held -= len(self._fds)
        self._fds.clear()
        self._mounts.close()
        self._watch.close()
        os.close(self._root_fd)
