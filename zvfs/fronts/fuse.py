"""The pyfuse3 front: maps kernel requests onto the virtual tree, and nothing else.

Entries and attributes get long timeouts and pages are kept in the kernel cache
(`keep_cache`). An open is a snapshot (`File.open`, handles.py): it sees the version of the file
current at the open (one stat locally), and its reads come from that version or fail with EIO.
What the kernel may hold of each inode is kept track of (fuse_kernel.py), so that an open whose
version differs from the kernel's pages or attributes drops them before it returns. Chunk files
opened in listing order get the next files' bytes put in the kernel's page cache ahead of their
opens (`_push_ahead_of`): their reads never reach the daemon.

Every handler turns failures into an errno: a corrupt shard or a backend fault is EIO for that
one request, and the daemon never dies from its input. `flush` and the xattr handlers are
deliberately left out (measured: each costs a round trip per file, and ENOSYS makes the kernel
stop asking). Live counters and `zvfs refresh` go through two hidden files at the mount root
(`.zvfs.stats`, `.zvfs.refresh`), found by name only: never listed, so `find`, `cp -r` and
`ls -a` never see them; only the mount's owner and root may open them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable

import pyfuse3
import trio

from ..core.shown import Shown
from ..core.source import RECHECK
from ..errors import (
    CorruptShardError,
    Gone,
    ShardChanged,
    Stale,
    StorageError,
    TooManyOpen,
    first_time,
)
from ..tree.handles import BytesHandle, Handle
from ..tree.nodes import ROOT_INO, File, Node, Stamp, Tree
from . import fuse_loop
from .fuse_kernel import KernelCache

log = logging.getLogger("zvfs.fuse")

TIMEOUT = 24 * 3600.0  # seconds the kernel may cache entries and attributes
#: seconds the kernel keeps a chunk file's attributes: a tenth of its shard's age (`_attrs_keep`),
#: within these bounds, as NFS's acregmin..acregmax (3..60 s): what changed lately is likely to
#: change again. A `stat` by path after a shard was rewritten showed the old size and mtime for
#: the entries' 24 h (an outside attacker: 18 of 18 rewrites still unseen after 8 s); a walk's
#: `stat`s come right after its listing, well within a minute
CHUNK_ATTRS = (1.0, 60.0)
STATS_FILE, REFRESH_FILE = ".zvfs.stats", ".zvfs.refresh"
#: inode numbers of the control files: the top of the inode space, never used by the tree
#: the I/O size shown to readers. 128 KiB, not 1 MiB: with 1 MiB, coreutils `cat` maps a
#: fresh 1 MiB buffer per file (66,045 page faults against 8,707 for 256 files of 1 MiB) and
#: reads them 18% slower; the kernel's requests are 1 MiB either way (read_ahead_kb 1024)
BLKSIZE = 1 << 17
CONTROL_INOS = {STATS_FILE: 2**63 - 2, REFRESH_FILE: 2**63 - 1}
_CONTROL = frozenset(CONTROL_INOS.values())
#: files a walk's open pushes ahead of it (`_push_ahead_of`), and the largest file pushed.
#: Small files only: the kernel stores pushed bytes page by page (25 us per 64 KiB file here,
#: against 5 for 4 KiB), while a READ fills large folios; `find | xargs cat`, zvfs/floor: 1 MiB
#: files 1.08 -> 1.12 if pushed (medians of 5 alternated runs). Files up to PUSH_NOW_MAX are
#: pushed before the open answers.
PUSH_FILES, PUSH_MAX_FILE = 4, BLKSIZE
PUSH_NOW_MAX = 16 << 10
#: inodes whose kernel state is kept track of (fuse_kernel.py): 100-200 bytes each, sized from
#: the index share of the memory budget (`kernel_table`); inodes let go of are invalidated in
#: the kernel (2-5 us each, in a worker thread)
KERNEL_KEPT = 1 << 17


def _attrs_keep(mtime_ns: int, now_ns: int) -> float:
    """Seconds the kernel may keep the attributes of a chunk file of a shard of `mtime_ns`."""
    return min(CHUNK_ATTRS[1], max(CHUNK_ATTRS[0], (now_ns - mtime_ns) / 1e10))


def kernel_table(opts) -> int:
    """Inodes whose kernel state a mount keeps track of: a fifth of the index cache's bytes at
    ~200 bytes each (5,000 under memory=64M, 40,000 at the default 256M)."""
    return max(4096, min(KERNEL_KEPT, opts.index_cache // 1000))


def open_handles(opts) -> int:
    """Open file handles a mount serves at once: each costs the daemon about 0.5 KiB (an
    outside attacker's 30 processes holding 570,000 took it to 287 MiB under memory=64M), so
    at most an eighth of the budget's worth (32,768 under memory=64M, 131,072 at the default
    256M); past that an open is ENFILE, with one log line."""
    return max(1024, opts.memory >> 11)


#: listing rows made at once for readdir requests (the kernel asks for a page of entries at a
#: time, ~25 of them: a window, kept with the directory handle, serves about ten requests).
#: A window is made on the loop: one of 1,024 rows took 10-30 ms, which other reads waited for
READDIR_WINDOW = 256
_FS_ENCODING = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND


@dataclass
class Counters:
    """What the FUSE front itself counts; `zvfs stats` adds the store's and the caches'."""

    files_read: int = 0  # files opened for reading
    bytes_served: int = 0
    eio: int = 0  # errors answered as EIO
    changed: int = 0  # opens that found another version than the kernel held (its pages dropped)
    pushed: int = 0  # files whose bytes were put in the kernel's cache ahead of their open
    bytes_pushed: int = 0


def _errno_of(exc: BaseException) -> int:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, Gone):
        return errno.ENOENT
    if isinstance(exc, Stale):
        return errno.ESTALE
    if isinstance(exc, TooManyOpen):  # (as the handle cap: refused until some close)
        if first_time("too many open"):
            log.error("%s", exc)
        return errno.ENFILE
    if isinstance(exc, CorruptShardError):
        return errno.EIO  # logged where the shard was found bad
    if isinstance(exc, (StorageError, ShardChanged)):
        if first_time(str(exc)):  # one line per problem, not per read
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


def _groups_of(pid: int) -> set[int]:
    """A process's supplementary groups (none if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


class _Parked:
    """A system task that does queued work, parked while there is none, started by the first
    `put` (a system task: it must never die, or the mount would end)."""

    def __init__(self, work: Callable[[list], Awaitable[None]], what: str):
        self.work = work
        self.what = what
        self.queue: deque = deque()
        self._task: trio.lowlevel.Task | None = None
        self._started = False

    def put(self, items: list) -> None:
        self.queue.append(items)
        if self._task is not None:
            task, self._task = self._task, None
            trio.lowlevel.reschedule(task)
        elif not self._started:
            self._started = True
            trio.lowlevel.spawn_system_task(self._run)
        fuse_loop.round_next()  # (it runs before the next request is read)

    async def _run(self) -> None:
        def abort(_) -> trio.lowlevel.Abort:  # (the mount is ending)
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            while self.queue:
                try:
                    await self.work(self.queue.popleft())
                except Exception:  # noqa: BLE001 - a system task must not die (it would end the mount)
                    log.exception("%s failed", self.what)
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(abort)


class _Open:
    """An open file: its inode and its handle (the snapshot it reads)."""

    __slots__ = ("ino", "handle")

    def __init__(self, ino: int, handle: Handle):
        self.ino = ino
        self.handle = handle


async def _nothing() -> None:
    pass


class ZvfsOperations(pyfuse3.Operations):
    def __init__(self, tree: Tree, shown: Shown | None = None, stats: Callable[[], dict] = dict,
                 refresh: Callable[[], Awaitable[None]] | None = None, push_ahead: int = 0, kernel_kept: int = KERNEL_KEPT,
                 kernel_checks: bool = False, max_handles: int = 1 << 17):
        super().__init__()
        self.tree = tree
        self.max_handles = max_handles  # open file handles served at once (`open_handles`)
        #: the kernel checks each access against the bits it holds (default_permissions: with
        #: allow_other or allow_root); an open that finds another version checks them again
        self.kernel_checks = kernel_checks
        #: ... and then holds a directory's bits only for RECHECK seconds: a directory the
        #: store narrows while mounted (seen by `OpenSource.watch_permissions`) is closed to
        #: other users within about that long, even to one whose working directory it is
        self.dir_timeout = RECHECK if kernel_checks else TIMEOUT
        #: bits, owners and times shown (core/shown.py)
        self.shown = shown or Shown()
        #: the source's live figures and its refresh (`zvfs stats`, `zvfs refresh`)
        self.source_stats, self.source_refresh = stats, refresh or _nothing
        self.counters = Counters()
        #: the mount's owner: the control files answer it and root only
        self.owner = os.getuid()
        self._open: dict[int, _Open] = {}  # file handle -> open file: reads need no lookup
        self._dirs: dict[int, tuple] = {}  # dir handle -> (node, its rows, the window of rows at hand: start, lists)
        self._next_fh = 1
        #: what the kernel may hold of each inode (fuse_kernel.py); inodes it lets go of are
        #: invalidated in the kernel by a worker thread (`_drop`)
        self._drops = _Parked(self._drop, "invalidating inodes")
        self.kernel = KernelCache(kernel_kept, self._drops.put)
        #: bytes of the files a walk opens next that may be put in the kernel's cache at once
        #: (`_push_ahead_of`), 0 for none; files to push once their opens answered
        self.push_ahead = push_ahead
        self._pushes = _Parked(self._push_later, "pushing files ahead")

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

    def _owner(self, a: pyfuse3.EntryAttributes, stamp: Stamp) -> None:
        a.st_uid, a.st_gid = self.shown.owner(stamp)

    async def _attrs(self, node: Node, entry: bool = False) -> pyfuse3.EntryAttributes:
        """Attributes, as the kernel is told them (recorded: fuse_kernel.py). An `entry` (a
        lookup's answer) of a file whose open handles read another version gets that
        version's alias; a getattr of the inode gets the size of the version its handles
        read."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.attr_timeout = TIMEOUT
        if node.is_dir:
            await node.ready()  # type: ignore[attr-defined]
        stamp = node.stamp()
        if node.is_dir:
            a.attr_timeout = self.dir_timeout
            a.st_mode = stat.S_IFDIR | self.shown.mode(True, stamp.mode)
            a.st_nlink = 2
            a.st_size = 0
        else:
            assert isinstance(node, File)
            a.st_mode = stat.S_IFREG | self.shown.mode(False, stamp.mode)
            a.st_nlink = 1
            token = node.token()
            held = self.kernel.size_for(node.ino, token)
            if held is None:
                a.st_size = await node.size()
                self.kernel.told_about(node.ino, token)
            elif entry:  # this version through an inode of its own
                a.st_size = await node.size()
                a.st_ino = self.kernel.number(node.ino, token, a.st_size)
                self.kernel.told_about(a.st_ino, token)
            else:  # handles read another version: its size
                a.st_size = held
        self._fill(a, stamp)
        if not node.is_dir:
            a.attr_timeout = _attrs_keep(a.st_mtime_ns, time.time_ns())
        if node.kernel_keeps < TIMEOUT:  # (shown as stored: removed, replaced by a directory...)
            a.entry_timeout, a.attr_timeout = node.kernel_keeps, min(a.attr_timeout, node.kernel_keeps)
        return a

    async def _alias_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        """getattr of an alias: the version it stands for while handles read it (ESTALE once let
        go of). With none open it shows the file as it is now, as a tree inode does: the alias
        is moved to the current version (as an open with none open moves it), which the kernel
        table then records (`told_about`: pages of the old one are not trusted). It answered
        the version it was made for, for the name's 24 h (a second outside attacker: an
        in-place rewrite's new mtime unseen by `stat` for 75 s and more after churn)."""
        alias = self.kernel.alias(ino)
        if alias is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        node = await self._node(alias.ino)
        if ino not in self.kernel.cached:
            if not await node.revalidate():  # type: ignore[attr-defined]
                raise pyfuse3.FUSEError(errno.ENOENT)  # (no longer stored)
            token = node.token()
            if token != alias.token:
                self.kernel.retarget(ino, token, await node.size())  # type: ignore[union-attr]
                alias = self.kernel.alias(ino) or alias
            self.kernel.told_about(ino, token)
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        stamp = node.stamp()
        a.st_mode = stat.S_IFREG | self.shown.mode(False, stamp.mode)
        a.st_nlink = 1
        a.st_size = alias.size if alias.size is not None else await node.size()  # type: ignore[union-attr]
        self._fill(a, stamp)
        a.attr_timeout = _attrs_keep(a.st_mtime_ns, time.time_ns())
        return a

    def _fill(self, a: pyfuse3.EntryAttributes, stamp: Stamp) -> None:
        self._owner(a, stamp)
        a.st_blksize = BLKSIZE
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.shown.mtime_ns(stamp)
        a.entry_timeout = TIMEOUT
        a.generation = 0

    def _control_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        """A control file: size 0 and no caching; read with direct I/O to its end; the mount's
        owner's alone."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = stat.S_IFREG | 0o400
        a.st_nlink = 1
        a.st_uid, a.st_gid = self.owner, os.getgid()
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
        return await self._attrs(node, entry=True)

    @guarded
    async def getattr(self, inode, ctx=None):
        if inode in _CONTROL:
            return self._control_attrs(inode)
        if self.kernel.is_alias(inode):
            return await self._alias_attrs(inode)
        node = await self._node(inode)
        # a file no handle reads is located anew (no longer stored: ENOENT); one that handles
        # read is answered as their version (`_attrs`) with no I/O: the kernel asks for the
        # attributes of an open file before a read once they are older than the attribute
        # timeout (`_attrs_keep`), and that must need no descriptor (a process holding 896
        # files under a lowered RLIMIT_NOFILE had 181 reads fail ENFILE: the relocation opened
        # shards the descriptor cache had let go of)
        if not node.is_dir and inode not in self.kernel.cached and not await node.revalidate():  # type: ignore[attr-defined]
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self._attrs(node)

    async def forget(self, inode_list):
        """Nothing to free: interned nodes live as long as the mount, computed ones are rebuilt."""

    @guarded
    async def opendir(self, inode, ctx):
        node = await self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._dirs[fh] = (node, None, 0, None)  # type: ignore[assignment]
        return fh

    @guarded
    async def readdir(self, fh, start_id, token):
        """The kernel asks for a large directory in pieces (about a page of entries each):
        the rows are built once per open directory handle and served by offset, so a listing
        costs linear time, not one rebuild per piece. One attributes object is filled per
        entry (readdir_reply copies it)."""
        node, rows, at, window = self._dirs[fh]
        if rows is None:
            rows = await node.rows()
        if window is None or not at <= start_id < at + len(window[0]):
            at, window = start_id, rows.window(start_id, start_id + READDIR_WINDOW)
        self._dirs[fh] = (node, rows, at, window)
        a = pyfuse3.EntryAttributes()
        a.st_blksize = BLKSIZE
        keeps = min(TIMEOUT, rows.kernel_keeps)
        a.entry_timeout, a.generation = keeps, 0
        shown: dict[tuple[bool, int | None], int] = {}  # (is_dir, the store's bits) -> st_mode
        reply, told, cached, last_stamp, held = pyfuse3.readdir_reply, self.kernel.told_about, self.kernel.cached, None, None
        now_ns, file_keeps = time.time_ns(), keeps
        names, inos, dirs, sizes, stamps, tokens = window
        # a store's own `.zvfs.stats` or `.zvfs.refresh` at the root is not listed: the name is
        # the control file's (lookup), and one name never serves two files
        hidden = CONTROL_INOS if node is self.tree.root else ()
        for j in range(start_id - at, len(names)):
            if hidden and names[j] in hidden:
                continue
            is_dir, stamp, size, ino = dirs[j], stamps[j], sizes[j], inos[j]
            a.st_ino = ino
            st_mode = shown.get((is_dir, stamp.mode))
            if st_mode is None:
                st_mode = shown[(is_dir, stamp.mode)] = (stat.S_IFDIR if is_dir else stat.S_IFREG) | self.shown.mode(is_dir, stamp.mode)
            a.st_mode = st_mode
            if stamp is not last_stamp:  # (a shard's files share one: times and owner set once per shard)
                last_stamp = stamp
                a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.shown.mtime_ns(stamp)
                self._owner(a, stamp)
                file_keeps = min(keeps, _attrs_keep(a.st_mtime_ns, now_ns))
            if is_dir:
                a.st_nlink, a.st_size, a.attr_timeout = 2, 0, min(self.dir_timeout, keeps)
            else:
                a.st_nlink = 1
                held = cached.get(ino)
                if held is not None and held[0] != tokens[j]:  # handles read another version:
                    a.st_ino = ino = self.kernel.number(ino, tokens[j], size)  # this one's alias
                    held = None
                a.st_size, a.attr_timeout = (0, 0) if size is None else (size, file_keeps)
            a.st_blocks = (a.st_size + 511) // 512
            if not reply(token, names[j].encode(*_FS_ENCODING), a, at + j + 1):  # os.fsencode, without its frame
                break
            if not is_dir and held is None:
                told(ino, tokens[j])

    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    async def open(self, inode, flags, ctx):
        """Hot path (once per file): no decorator frame, the node usually comes from the
        tree's recent table. Never direct I/O: it would be ~25% faster for 1 MiB files, but
        mmap of a direct-I/O FUSE file fails (ENODEV), and readers that mmap chunks must work.
        An open that finds another version than the inode's open handles read, or than its
        alias stands for, is ESTALE: the kernel looks the name up again and gets an inode of
        that version (fuse_kernel.py)."""
        if flags & _WRITING:
            raise pyfuse3.FUSEError(errno.EROFS)
        if len(self._open) >= self.max_handles:
            if first_time("open handles"):
                log.error("%d files open through the mount: more opens are refused (ENFILE) until some close; "
                          "raise -o memory= to allow more", len(self._open))
            raise pyfuse3.FUSEError(errno.ENFILE)
        alias = None
        try:
            node = self.tree.known(inode)
            if node is None:
                if inode in _CONTROL:
                    return await self._open_control(inode, ctx)
                if self.kernel.is_alias(inode):
                    alias = self.kernel.alias(inode)
                    if alias is None:
                        raise pyfuse3.FUSEError(errno.ESTALE)
                node = await self._node(inode if alias is None else alias.ino)
            if node.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            handle = await node.open()  # type: ignore[union-attr]
        except pyfuse3.FUSEError:
            raise
        except Exception as e:  # noqa: BLE001
            code = self._fail(e)
            if code == errno.ENOENT and inode not in self.kernel.cached:
                self._forget_attrs(inode)  # (a stat by this path asks again: ENOENT)
            raise pyfuse3.FUSEError(code) from None
        opened = self.kernel.opening(inode, handle.token, handle.size)
        if opened is None:  # another version: the kernel asks for the name again
            handle.release()
            self.counters.changed += 1
            raise pyfuse3.FUSEError(errno.ESTALE)
        keep, forget_attrs = opened
        if alias is not None and alias.token != handle.token:
            self.kernel.retarget(inode, handle.token, handle.size)
        if forget_attrs:  # the kernel's pages, size and times are of another version (or unknown)
            self.counters.changed += 1
            self._forget_kernel_copy(inode)
            self.tree.remember(node)  # (what the next getattr asks about: this version)
            if self.kernel_checks and not self._may_read(node, ctx):  # type: ignore[arg-type]
                self.kernel.closed(inode)
                handle.release()
                raise pyfuse3.FUSEError(errno.EACCES)
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._open[fh] = _Open(inode, handle)
        self.counters.files_read += 1
        if self.push_ahead:
            self._push_ahead_of(node)  # type: ignore[arg-type]
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    def _may_read(self, node: File, ctx) -> bool:
        """Whether the caller may read `node` by the bits now shown. The kernel checked the
        bits it held, which are another version's when the open found a new one: a shard
        narrowed to 0600 let one more open of another user through (an outside attacker, 20
        of 20). The owner's bits for its owner, the group's for its group (the caller's own
        and supplementary groups), else the others'; root reads all."""
        if ctx is None or ctx.uid == 0:
            return True
        stamp = node.stamp()
        bits = self.shown.mode(False, stamp.mode)
        uid, gid = self.shown.owner(stamp)
        if ctx.uid == uid:
            return bool(bits & 0o400)
        if ctx.gid == gid or gid in _groups_of(ctx.pid):
            return bool(bits & 0o040)
        return bool(bits & 0o004)

    def _forget_kernel_copy(self, inode: int) -> None:
        """The kernel's pages and attributes of `inode` invalidated before the open answers.
        (`keep_cache` False alone is not enough: the kernel drops the pages after the reply, in
        the opener's context, and another open answered meanwhile with `keep_cache`, as the
        new version is now recorded, read the old pages before that: 1-3 rounds in 400 of four
        readers opening a file together after each rename over its shard.) On the loop, with
        no await before the reply: no open of the inode is answered in between, and no read
        of it is pending (an open that drops pages has no open handle of its inode, which is
        what makes the wait for page locks safe here, as for `_push`)."""
        try:
            pyfuse3.invalidate_inode(inode, False)
        except OSError as e:
            log.debug("cannot invalidate inode %d: %s", inode, e)

    @staticmethod
    def _forget_attrs(inode: int) -> None:
        """The kernel's attributes of a file found gone invalidated: the kernel keeps a name's
        entry and attributes 24 h, so a stat by its path answered the last size long after an
        open found it no longer stored (an outside attacker). Attributes only: no page lock is
        waited for, safe on the loop."""
        try:
            pyfuse3.invalidate_inode(inode, True)
        except OSError:  # (the kernel no longer has it)
            pass

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
            else:
                self._pushes.put(ahead)
        except Exception:  # noqa: BLE001 - a push is only a hint (the opens will read), and
            log.exception("pushing the files after inode %d failed", file.ino)  # must not end the mount

    async def _push_later(self, files: list[File]) -> None:
        self._push(files)

    def _push(self, files: list[File]) -> None:
        """Only files with no open handle: a read of an open file may hold its pages locked
        until this loop answers it, and the push would wait for that lock for ever (a mount
        without this rule hung). The check and the push run with no await between them. The
        bytes pushed are those of the version the file's token names (read and checked
        against it now), and the kernel's state of the inode is recorded as that version, so
        the open that follows keeps them only if it sees the same version."""
        budget = self.push_ahead
        for file in files:
            size = file.known_size()
            if not size:
                continue
            if size > min(budget, PUSH_MAX_FILE):
                break
            try:
                data = file.bytes_at_hand()
                if data is None:
                    break
                if not self.kernel.pushing(file.ino, file.token()):
                    continue
                pyfuse3.notify_store(file.ino, 0, data)
            except Exception as e:  # noqa: BLE001 - a push is only a hint: the open will read
                log.debug("not pushed ahead: inode %d: %s", file.ino, e)
                break
            budget -= size
            self.counters.pushed += 1
            self.counters.bytes_pushed += size

    async def _drop(self, inodes: list[int]) -> None:
        """Inodes the kernel table let go of: their pages and attributes are invalidated in the
        kernel, in a worker thread (a page invalidation waits for the page lock a pending read
        may hold, which this loop answers meanwhile)."""

        def drop() -> None:
            for ino in inodes:
                try:
                    pyfuse3.invalidate_inode(ino, False)
                except OSError:  # (the kernel no longer has it: nothing to drop)
                    pass

        try:
            await trio.to_thread.run_sync(drop)
        finally:
            self.kernel.dropped(inodes)

    async def read(self, fh, off, size):
        """Hot path: no decorator frame. The bytes may be a view of the store's scratch buffer
        (no copy in Python): pyfuse3 replies with them before anything else runs. A handle
        whose version can no longer be read answers EIO (never another version's bytes)."""
        opened = self._open.get(fh)
        if opened is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        try:
            data = await opened.handle.read_for_reply(off, size)
        except Exception as e:  # noqa: BLE001 - the daemon must outlive any input
            raise pyfuse3.FUSEError(self._fail(e)) from None
        self.counters.bytes_served += len(data)
        return data

    async def release(self, fh):
        opened = self._open.pop(fh, None)
        if opened is not None:
            opened.handle.release()
            self.kernel.closed(opened.ino)

    # -- control files

    async def _open_control(self, inode: int, ctx) -> pyfuse3.FileInfo:
        if ctx.uid not in (0, self.owner):
            raise pyfuse3.FUSEError(errno.EACCES)
        if inode == CONTROL_INOS[REFRESH_FILE]:
            await self.source_refresh()
            self.forget_kernel_view()
            content = {"refreshed": True}
        else:
            content = {**self.source_stats(), **vars(self.counters)}
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        data = (json.dumps(content, indent=2) + "\n").encode()
        self._open[fh] = _Open(inode, BytesHandle(data, None))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    def forget_kernel_view(self) -> None:
        """After `zvfs refresh` (the source dropped every cache and listing) or a change of
        directory permissions: nothing the kernel holds is trusted any more (every next open
        checks its bits again, under `kernel_checks`), and the kernel looks everything up
        again (its entries under the root are invalidated, which prunes the whole cached tree
        below them)."""
        self.kernel.clear()
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
