"""The pyfuse3 front: maps kernel requests onto the virtual tree, and nothing else.

The data is immutable, so entries and attributes get long timeouts and pages are kept in the
kernel cache (`keep_cache`). Every handler turns failures into an errno: a corrupt shard or a
backend fault is EIO for that one request, and the daemon never dies from its input.
`flush` and the xattr handlers are deliberately left out (measured: each costs a round trip
per file, and ENOSYS makes the kernel stop asking).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time

import pyfuse3

from .errors import CorruptShardError, StorageError
from .tree import Dir, File, Node, Tree

log = logging.getLogger("zvfs.fuse")

TIMEOUT = 24 * 3600.0  # seconds the kernel may cache entries and attributes


def _errno_of(exc: BaseException) -> int:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, CorruptShardError):
        return errno.EIO  # logged where the shard was found bad
    if isinstance(exc, StorageError):
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
            raise pyfuse3.FUSEError(_errno_of(e)) from None

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


class ZvfsOperations(pyfuse3.Operations):
    def __init__(self, tree: Tree):
        super().__init__()
        self.tree = tree
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.stamp_ns = time.time_ns()
        self._open: dict[int, File] = {}  # file handle -> node: reads need no lookup
        self._next_fh = 1

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
        if node.is_dir:
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = 2
            a.st_size = 0
        else:
            assert isinstance(node, File)
            a.st_mode = stat.S_IFREG | 0o444
            a.st_nlink = 1
            size = node.known_size() if listing else await node.size()
            if size is None:
                size, a.attr_timeout = 0, 0
            a.st_size = size
        a.st_uid = self.uid
        a.st_gid = self.gid
        a.st_blksize = 1 << 20
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.stamp_ns
        a.entry_timeout = TIMEOUT
        a.generation = 0
        return a

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        parent = await self._node(parent_inode)
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        node = await parent.lookup(os.fsdecode(name))  # type: ignore[union-attr]
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.tree.remember(node)
        return await self._attrs(node)

    @guarded
    async def getattr(self, inode, ctx=None):
        return await self._attrs(await self._node(inode))

    async def forget(self, inode_list):
        """Nothing to free: interned nodes live as long as the mount, computed ones are rebuilt."""

    @guarded
    async def opendir(self, inode, ctx):
        if not (await self._node(inode)).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    @guarded
    async def readdir(self, fh, start_id, token):
        node = await self._node(fh)
        assert isinstance(node, Dir)
        entries = await node.entries()
        for i in range(start_id, len(entries)):
            name, child = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), await self._attrs(child, listing=True), i + 1):
                break
            self.tree.remember(child)

    async def releasedir(self, fh):
        pass

    async def open(self, inode, flags, ctx):
        """Hot path (once per file): no decorator frame, the node usually comes from the
        tree's recent table. Never direct I/O: it would be ~25% faster for 1 MiB files, but
        mmap of a direct-I/O FUSE file fails (ENODEV), and readers that mmap chunks must work."""
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        try:
            node = await self._node(inode)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:  # noqa: BLE001
            raise pyfuse3.FUSEError(_errno_of(e)) from None
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._open[fh] = node  # type: ignore[assignment]
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh, off, size):
        """Hot path: no decorator frame."""
        node = self._open.get(fh)
        if node is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        try:
            return await node.read(off, size)
        except Exception as e:  # noqa: BLE001 - the daemon must outlive any input
            raise pyfuse3.FUSEError(_errno_of(e)) from None

    async def release(self, fh):
        self._open.pop(fh, None)

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s

    async def _read_only(self, *args, **kwargs):
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = write = create = _read_only
    setxattr = removexattr = _read_only
