"""The pyfuse3 front: maps kernel requests onto the virtual tree, and nothing else.

Entries and attributes get long timeouts and pages are kept in the kernel cache
(`keep_cache`): stores are read as immutable. What changes anyway (a shard rewritten or
replaced while mounted) is noticed when a chunk file is opened (`File.revalidate`: one stat
locally) or by a read whose shard no longer has the expected version; the kernel's cached
size and pages of that file are then invalidated before anything is read, so a reader gets
the chunk as it was or as it is, or EIO, never bytes of another chunk. Chunk files opened in
listing order get the next files' bytes put in the kernel's page cache ahead of their opens
(`_push_ahead_of`): their reads never reach the daemon.

Every handler turns failures into an errno: a corrupt shard or a backend fault is EIO for that
one request, and the daemon never dies from its input. `flush` and the xattr handlers are
deliberately left out (measured: each costs a round trip per file, and ENOSYS makes the kernel
stop asking). Live counters and `zvfs refresh` go through two hidden files at the mount root
(`.zvfs.stats`, `.zvfs.refresh`), found by name only: never listed, so `find`, `cp -r` and
`ls -a` never see them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import pyfuse3
import trio

from .errors import CorruptShardError, ShardChanged, StorageError
from .tree import ROOT_INO, Dir, File, Node, Rows, Tree

log = logging.getLogger("zvfs.fuse")

TIMEOUT = 24 * 3600.0  # seconds the kernel may cache entries and attributes
STATS_FILE, REFRESH_FILE = ".zvfs.stats", ".zvfs.refresh"
#: inode numbers of the control files: the top of the inode space, never used by the tree
#: the I/O size shown to readers. 128 KiB, not 1 MiB: with 1 MiB, coreutils `cat` maps a
#: fresh 1 MiB buffer per file (66,045 page faults against 8,707 for 256 files of 1 MiB) and
#: reads them 18% slower; the kernel's requests are 1 MiB either way (read_ahead_kb 1024)
BLKSIZE = 1 << 17
CONTROL_INOS = {STATS_FILE: 2**63 - 2, REFRESH_FILE: 2**63 - 1}
_CONTROL = frozenset(CONTROL_INOS.values())
#: files a walk's open pushes ahead of it (`_push_ahead_of`), the largest file pushed, and
#: how many pushed files are kept track of. Small files only: the kernel stores pushed bytes
#: page by page (25 us per 64 KiB file here, against 5 for 4 KiB), while a READ fills large
#: folios; `find | xargs cat`, zvfs/floor: 1 MiB files 1.08 -> 1.12 if pushed (medians of 5
#: alternated runs). Files up to PUSH_NOW_MAX are pushed before the open answers.
PUSH_FILES, PUSH_MAX_FILE, PUSHED_KEPT = 4, BLKSIZE, 4096
PUSH_NOW_MAX = 16 << 10
_UNSET = object()
_FS_ENCODING = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND


@dataclass
class Counters:
    """What the FUSE front itself counts; `zvfs stats` adds the store's and the caches'."""

    files_read: int = 0  # files opened for reading
    bytes_served: int = 0
    eio: int = 0  # errors answered as EIO
    changed: int = 0  # chunk files found changed at open (shard rewritten or replaced)
    pushed: int = 0  # files whose bytes were put in the kernel's cache ahead of their open
    bytes_pushed: int = 0


@dataclass
class Control:
    """The mount's live figures and its refresh, as the FUSE front reaches them."""

    stats: Callable[[], dict] = dict
    refresh: Callable[[], None] = lambda: None
    counters: Counters = field(default_factory=Counters)


def _errno_of(exc: BaseException) -> int:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, CorruptShardError):
        return errno.EIO  # logged where the shard was found bad
    if isinstance(exc, (StorageError, ShardChanged)):
        log.error("%s", exc)
        return errno.EIO
    log.exception("internal error")
    return errno.EIO


def guarded(handler):
    """Any exception leaves the handler as a FUSEError (EIO unless it says otherwise)."""

    async def wrapper(self, *args):
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:  # noqa: BLE001 - the daemon must outlive any input
            raise pyfuse3.FUSEError(self._fail(e)) from None

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


class _Handle:
    """An open file: the node, and whether any bytes were served from it yet."""

    __slots__ = ("node", "served")

    def __init__(self, node: File):
        self.node = node
        self.served = False


class ZvfsOperations(pyfuse3.Operations):
    def __init__(self, tree: Tree, control: Control | None = None, root_mode: int | None = None,
                 uid: int | None = None, gid: int | None = None, umask: int | None = None,
                 push_ahead: int = 0):
        super().__init__()
        self.tree = tree
        self.control = control or Control()
        self.counters = self.control.counters
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.stamp_ns = time.time_ns()
        #: permission bits no node may exceed: the store root's read and search bits (local
        #: stores), so a store closed to others stays closed through an allow_other mount
        self.mask = 0o555 if root_mode is None else root_mode & 0o555
        #: an administrator's `umask=`: every node gets 0555/0444 less these bits, whatever the
        #: store's own bits (the way to share a store that is closed to others, on purpose)
        self.umask = umask
        self._open: dict[int, _Handle] = {}  # file handle -> open file: reads need no lookup
        self._dirs: dict[int, tuple[Dir, Rows | None]] = {}  # dir handle -> listing
        self._next_fh = 1
        #: bytes of the files a walk opens next that may be put in the kernel's cache at once
        #: (`_push_ahead_of`), 0 for none; the files pushed and not opened since, and how
        #: many handles each open inode has (a file with one is never pushed)
        self.push_ahead = push_ahead
        self._pushed: OrderedDict[int, File] = OrderedDict()
        self._unchecked: set[int] = set()  # pushed files being dropped from the kernel's cache
        self._opened: dict[int, int] = {}
        self._to_push: deque[list[File]] = deque()  # files to push once their opens answered
        self._to_push_started = False
        self._pusher: trio.lowlevel.Task | None = None  # the task pushing them, parked

    def _perm(self, is_dir: bool, mode: int | None) -> int:
        """Permission bits shown: never a write bit, never exec on files, never wider than the
        store's own (unless `umask=` says otherwise)."""
        top = 0o555 if is_dir else 0o444
        if self.umask is not None:
            return top & ~self.umask
        return top & self.mask & (0o7777 if mode is None else mode)

    def _fail(self, e: BaseException) -> int:
        code = _errno_of(e)
        if code == errno.EIO:
            self.counters.eio += 1
        return code

    async def _node(self, ino: int) -> Node:
        node = await self.tree.node(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    async def _attrs(self, node: Node, listing: bool = False) -> pyfuse3.EntryAttributes:
        """Attributes; in a listing, a file whose size needs I/O or decoding gets size 0 and
        an attribute timeout of 0, so the kernel asks `getattr` (the exact size) before any
        stat or read of it, and the listing itself decodes nothing."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.attr_timeout = TIMEOUT
        mode, mtime = node.stamp()
        if node.is_dir:
            a.st_mode = stat.S_IFDIR | self._perm(True, mode)
            a.st_nlink = 2
            a.st_size = 0
        else:
            assert isinstance(node, File)
            a.st_mode = stat.S_IFREG | self._perm(False, mode)
            a.st_nlink = 1
            size = node.known_size() if listing else await node.size()
            if size is None:
                size, a.attr_timeout = 0, 0
            a.st_size = size
        a.st_uid = self.uid
        a.st_gid = self.gid
        a.st_blksize = BLKSIZE
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.stamp_ns if mtime is None else int(mtime * 1e9)
        a.entry_timeout = TIMEOUT
        a.generation = 0
        return a

    def _control_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        """A control file: size 0 and no caching; read with direct I/O to its end."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = stat.S_IFREG | 0o444
        a.st_nlink = 1
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = time.time_ns()
        a.entry_timeout = a.attr_timeout = 0
        return a

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        name = os.fsdecode(name)
        if parent_inode == ROOT_INO and name in CONTROL_INOS:
            return self._control_attrs(CONTROL_INOS[name])
        parent = await self._node(parent_inode)
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        node = await parent.lookup(name)  # type: ignore[union-attr]
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.tree.remember(node)
        return await self._attrs(node)

    @guarded
    async def getattr(self, inode, ctx=None):
        if inode in _CONTROL:
            return self._control_attrs(inode)
        return await self._attrs(await self._node(inode))

    async def forget(self, inode_list):
        """Nothing to free: interned nodes live as long as the mount, computed ones are rebuilt."""

    @guarded
    async def opendir(self, inode, ctx):
        node = await self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._dirs[fh] = (node, None)  # type: ignore[assignment]
        return fh

    @guarded
    async def readdir(self, fh, start_id, token):
        """The kernel asks for a large directory in pieces (about a page of entries each):
        the rows are built once per open directory handle and served by offset, so a listing
        costs linear time, not one rebuild per piece. One attributes object is filled per
        entry (readdir_reply copies it)."""
        node, rows = self._dirs[fh]
        if rows is None:
            rows = await node.rows()
            self._dirs[fh] = (node, rows)
        a = pyfuse3.EntryAttributes()
        a.st_uid, a.st_gid, a.st_blksize = self.uid, self.gid, BLKSIZE
        a.entry_timeout, a.generation = TIMEOUT, 0
        shown: dict[tuple[bool, int | None], int] = {}  # (is_dir, the store's bits) -> st_mode
        reply, stamp, last_mtime = pyfuse3.readdir_reply, self.stamp_ns, _UNSET
        names, inos, dirs, sizes, modes, mtimes = rows.names, rows.inos, rows.is_dir, rows.sizes, rows.modes, rows.mtimes
        for i in range(start_id, len(names)):
            is_dir, mode, size = dirs[i], modes[i], sizes[i]
            a.st_ino = inos[i]
            st_mode = shown.get((is_dir, mode))
            if st_mode is None:
                st_mode = shown[(is_dir, mode)] = (stat.S_IFDIR if is_dir else stat.S_IFREG) | self._perm(is_dir, mode)
            a.st_mode = st_mode
            if is_dir:
                a.st_nlink, a.st_size, a.attr_timeout = 2, 0, TIMEOUT
            else:
                a.st_nlink = 1
                a.st_size, a.attr_timeout = (0, 0) if size is None else (size, TIMEOUT)
            a.st_blocks = (a.st_size + 511) // 512
            mtime = mtimes[i]
            if mtime is not last_mtime:  # (a shard's files share one: times set once per shard)
                last_mtime = mtime
                a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = stamp if mtime is None else int(mtime * 1e9)
            if not reply(token, names[i].encode(*_FS_ENCODING), a, i + 1):  # os.fsencode, without its frame
                break

    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    async def open(self, inode, flags, ctx):
        """Hot path (once per file): no decorator frame, the node usually comes from the
        tree's recent table. Never direct I/O: it would be ~25% faster for 1 MiB files, but
        mmap of a direct-I/O FUSE file fails (ENODEV), and readers that mmap chunks must work."""
        if flags & _WRITING:
            raise pyfuse3.FUSEError(errno.EROFS)
        try:
            node = self.tree.known(inode)
            if node is None:
                if inode in _CONTROL:
                    return self._open_control(inode)
                node = await self._node(inode)
            if node.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            file, changed = await node.revalidate()  # type: ignore[union-attr]
            if file is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if self._pushed:
                pushed = self._pushed.pop(inode, None)
                changed = changed or pushed is not None and not file.holds_bytes_of(pushed)
            if self._unchecked and inode in self._unchecked:
                changed = True
            if changed:
                await self._forget_cached(inode)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:  # noqa: BLE001
            raise pyfuse3.FUSEError(self._fail(e)) from None
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._open[fh] = _Handle(file)
        self._opened[inode] = self._opened.get(inode, 0) + 1
        self.counters.files_read += 1
        if self.push_ahead:
            self._push_ahead_of(file)
        return pyfuse3.FileInfo(fh=fh, keep_cache=not changed)

    def _push_ahead_of(self, file: File) -> None:
        """A walk in listing order (`cp -r`, `find | xargs cat`) opens the next files right
        after this one: their bytes, where they are at hand (a local shard's cached pages), go
        into the kernel's page cache (`notify_store`), so that their opens need no READ
        request: one round trip of three per file saved (docs/benchmarks.md). They are pushed
        before this open answers, except larger files opened by a lone reader: those once it
        has (a parked task), so that the reader reads this file meanwhile. (A small file's push
        costs less than the task switch; with other files open, other readers keep this loop
        busy and the switch is pure cost. 64 KiB files, zvfs/floor: 1 reader 1.11 -> 1.05,
        4 readers 1.12 -> 1.08.)"""
        try:
            ahead = self.tree.listed.following(file.ino, PUSH_FILES)
            if not ahead:
                return
            if (file.known_size() or 0) <= PUSH_NOW_MAX or len(self._open) > 1:
                self._push(ahead)
                return
            self._to_push.append(ahead)
            if self._pusher is not None:
                task, self._pusher = self._pusher, None
                trio.lowlevel.reschedule(task)
            elif not self._to_push_started:
                self._to_push_started = True
                trio.lowlevel.spawn_system_task(self._push_queued)
        except Exception:  # noqa: BLE001 - a push is only a hint (the opens will read), and
            log.exception("pushing the files after inode %d failed", file.ino)  # must not end the mount

    async def _push_queued(self) -> None:
        def abort(_) -> trio.lowlevel.Abort:  # (the mount is ending)
            self._pusher = None
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            while self._to_push:
                try:
                    self._push(self._to_push.popleft())
                except Exception:  # noqa: BLE001 - a system task must not die (it would end the mount)
                    log.exception("pushing files ahead failed")
            self._pusher = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(abort)

    def _push(self, files: list[File]) -> None:
        """Only files with no open handle: a read of an open file may hold its pages locked
        until this loop answers it, and the push would wait for that lock for ever (a mount
        without this rule hung). The check and the push run with no await between them. The
        bytes are checked once, at the open of a pushed file (`File.holds_bytes_of`: its
        shard still at the version its listing saw), else the kernel drops them; a pushed file
        no longer kept track of is dropped, and until it is, opened as a changed one."""
        budget = self.push_ahead
        for file in files:
            size = file.known_size()
            if file.ino in self._opened or not size:
                continue
            if size > min(budget, PUSH_MAX_FILE):
                break
            try:
                data = file.bytes_at_hand()
                if data is None:
                    break
                self._pushed[file.ino] = file  # (first: a store that fails half way may leave pages)
                pyfuse3.notify_store(file.ino, 0, data)
            except Exception as e:  # noqa: BLE001 - a push is only a hint: the open will read
                log.debug("not pushed ahead: inode %d: %s", file.ino, e)
                break
            budget -= size
            self.counters.pushed += 1
            self.counters.bytes_pushed += size
        while len(self._pushed) > PUSHED_KEPT:  # never opened: the kernel must not keep them unchecked
            inode = self._pushed.popitem(last=False)[0]
            self._unchecked.add(inode)  # (now: the drop below runs later)
            trio.lowlevel.spawn_system_task(self._drop_pushed, inode)

    async def _drop_pushed(self, inode: int) -> None:
        try:
            await self._drop_cached(inode)
        finally:
            self._unchecked.discard(inode)

    async def _forget_cached(self, inode: int) -> None:
        """The kernel holds the size and pages of an old version of this file: drop them before
        the open returns. (From a worker thread: the notification is a blocking write to
        /dev/fuse, and the event loop must stay free to answer whatever the kernel does
        meanwhile.) Never awaited inside a read of the same inode: dropping its pages waits for
        the page lock that read holds (see `_reread`)."""
        self.counters.changed += 1
        await self._drop_cached(inode)

    async def _drop_cached(self, inode: int) -> None:
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, inode, False)
        except OSError as e:
            log.debug("cannot invalidate inode %d: %s", inode, e)

    async def read(self, fh, off, size):
        """Hot path: no decorator frame. The bytes may be a view of the store's scratch buffer
        (no copy in Python): pyfuse3 replies with them before anything else runs."""
        handle = self._open.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        try:
            data = await handle.node.read_for_reply(off, size)
        except ShardChanged as e:
            data = await self._reread(handle, off, size, e)
        except Exception as e:  # noqa: BLE001 - the daemon must outlive any input
            raise pyfuse3.FUSEError(self._fail(e)) from None
        handle.served = True
        self.counters.bytes_served += len(data)
        return data

    async def _reread(self, handle: _Handle, off: int, size: int, e: ShardChanged) -> bytes:
        """The shard changed under an open file (noticed by the read itself: a remote object
        replaced, a local one rewritten in place). A handle that has served nothing yet may
        switch to the new version when the file keeps its size (the kernel's idea of it);
        otherwise the read is EIO, and the kernel's cached size and pages are dropped so the
        next open sees the new file."""
        node = handle.node
        try:
            size_before = node.known_size()
            file, _ = await node.revalidate()
            if file is not None and not handle.served and size_before is not None and file.known_size() == size_before:
                return await file.read(off, size)
        except Exception as again:  # noqa: BLE001
            raise pyfuse3.FUSEError(self._fail(again)) from None
        # after this read has answered: the invalidation waits for the page lock it holds
        trio.lowlevel.spawn_system_task(self._forget_cached, node.ino)
        raise pyfuse3.FUSEError(self._fail(e))

    async def release(self, fh):
        handle = self._open.pop(fh, None)
        if handle is not None:
            ino = handle.node.ino
            n = self._opened.pop(ino, 1) - 1
            if n:
                self._opened[ino] = n

    # -- control files

    def _open_control(self, inode: int) -> pyfuse3.FileInfo:
        if inode == CONTROL_INOS[REFRESH_FILE]:
            self.refresh()
            content = {"refreshed": True}
        else:
            content = {**self.control.stats(), **{k: v for k, v in vars(self.counters).items()}}
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._open[fh] = _Handle(_Snapshot(inode, (json.dumps(content, indent=2) + "\n").encode()))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    def refresh(self) -> None:
        """`zvfs refresh`: drop every cache, forget listings, and make the kernel look
        everything up again (its entries under the root are invalidated, which prunes the
        whole cached tree below them)."""
        self.control.refresh()
        self.tree.forget_listings()
        trio.lowlevel.spawn_system_task(self._invalidate_root)

    async def _invalidate_root(self) -> None:
        try:
            names = [name for name, _ in await self.tree.root.entries()]  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001
            log.warning("refresh: cannot list the root: %s", e)
            names = []

        def invalidate() -> None:
            for name in names:
                try:
                    pyfuse3.invalidate_entry(ROOT_INO, os.fsencode(name))
                except OSError:
                    pass
            try:
                pyfuse3.invalidate_inode(ROOT_INO, False)
            except OSError:
                pass

        await trio.to_thread.run_sync(invalidate)
        log.info("refreshed: caches dropped, %d root entries invalidated", len(names))

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s

    async def _read_only(self, *args, **kwargs):
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = write = create = _read_only
    setxattr = removexattr = _read_only


class _Snapshot(File):
    """What a control file said when it was opened."""

    __slots__ = ("data",)

    def __init__(self, ino: int, data: bytes):
        super().__init__(ino)
        self.data = data

    def known_size(self) -> int | None:
        return len(self.data)

    async def read(self, offset: int, size: int) -> bytes:
        return self.data[offset:offset + size]
