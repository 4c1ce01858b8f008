"""The core by path: what the fronts that speak paths (`zvfs serve`, the fsspec filesystem,
`zvfs ls`/`cat`) ask of an opened source. The FUSE front speaks node numbers instead and walks
the same tree (tree/nodes.py); everything here is front-agnostic.

- `resolve(path)`: the node at a `/`-separated path; `.` and `..`, NUL and names or paths too
  long for a file system are refused (`BadPath`), so no path ever resolves outside the tree,
  whatever the store's own key syntax makes of it.
- `stat(path)`, `listdir(path)`: what `Stat` says, as a mount shows it (core/shown.py).
- `open(path)`: an `OpenFile`, a snapshot of one version (the contract, docs/reliability.md):
  its reads come from that version or fail (`ShardChanged`), never another version's bytes.
  Its `etag` names the version and place of its bytes.

With `public=True` (anonymous readers: `zvfs serve`), only nodes that anyone may read are
served, and every directory on the way must let anyone through (`PermissionError`): a server
run by the store's owner never shows more than the store shows everyone.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat as stat_module
from dataclasses import dataclass
from typing import Hashable

from ..errors import Gone, ZvfsError
from ..storage.base import MAX_NAME
from ..tree.handles import BytesHandle, Handle
from ..tree.nodes import File, Node
from .shown import Shown
from .source import OpenSource

MAX_PATH = 4096  # bytes, as PATH_MAX


class BadPath(ZvfsError, ValueError):
    """A path that can never name a node of the tree."""


def _error(code: int, path: str) -> OSError:
    exc = {errno.ENOENT: FileNotFoundError, errno.ENOTDIR: NotADirectoryError, errno.EISDIR: IsADirectoryError,
           errno.EACCES: PermissionError}[code]
    return exc(code, os.strerror(code), path)


def parts_of(path: str) -> list[str]:
    """The names along `path` (empty components dropped: `a//b` is `a/b`, as POSIX reads it)."""
    if "\0" in path:
        raise BadPath(repr(path), "NUL in a path")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise BadPath(path[:64] + "...", "path too long")
    parts = [p for p in path.split("/") if p]
    for p in parts:
        if p in (".", ".."):
            raise BadPath(path, "'.' and '..' are not names in the tree")
        if len(p.encode("utf-8", "surrogateescape")) > MAX_NAME:
            raise BadPath(p[:64] + "...", "name too long")
    return parts


@dataclass(frozen=True, slots=True)
class Stat:
    """A node as shown: `size` None in a listing means not known without reading the file
    (`stat` always knows it); `etag` only from `stat` and `open`."""

    name: str
    is_dir: bool
    size: int | None
    mode: int  # permission bits (0555 at most)
    mtime_ns: int
    uid: int
    gid: int
    etag: str | None = None

    @property
    def st_mode(self) -> int:
        return (stat_module.S_IFDIR if self.is_dir else stat_module.S_IFREG) | self.mode


class OpenFile:
    """An open file of the tree: a snapshot of one version (`read` of that version or
    `ShardChanged`); close it (or use it as an async context manager)."""

    __slots__ = ("stat", "handle")

    def __init__(self, stat: Stat, handle: Handle):
        self.stat = stat
        self.handle = handle

    @property
    def size(self) -> int:
        return self.stat.size  # type: ignore[return-value]

    @property
    def etag(self) -> str | None:
        return self.stat.etag

    async def read(self, offset: int, size: int) -> bytes:
        if offset >= self.size or size <= 0:
            return b""
        return await self.handle.read(offset, min(size, self.size - offset))

    def close(self) -> None:
        self.handle.release()

    async def __aenter__(self) -> "OpenFile":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class Paths:
    """An opened source by path. `shown`: bits and owners as a mount shows them (default: the
    store's own); `public`: serve only what anyone may read (see the module docstring)."""

    def __init__(self, source: OpenSource, shown: Shown | None = None, public: bool = False):
        self.source = source
        self.shown = shown or Shown(source.root)
        self.public = public
        from .. import (
            __version__,  # (the bytes a view gives for a version may change with zvfs)
        )

        #: what else decides the bytes a path of this view holds, besides the store's version
        self._salt = f"{__version__}\0{source.view}\0{source.options.n5_compression}\0"

    async def resolve(self, path: str) -> Node:
        node: Node | None = self.source.tree.root
        assert node is not None
        await self._check(node, path)
        for name in parts_of(path):
            if not node.is_dir:
                raise _error(errno.ENOTDIR, path)
            node = await node.lookup(name)  # type: ignore[union-attr]
            if node is None:
                raise _error(errno.ENOENT, path)
            await self._check(node, path)
        return node

    async def _check(self, node: Node, path: str) -> None:
        """A directory's bits (a file's are checked by its open, as the open finds them:
        `open_node`)."""
        if node.is_dir:
            await node.ready()  # type: ignore[attr-defined]
            if self.public and not self.shown.public(True, node.stamp().mode):
                raise _error(errno.EACCES, path)

    def _stat(self, name: str, is_dir: bool, size: int | None, stamp, etag: str | None = None) -> Stat:
        uid, gid = self.shown.owner(stamp)
        return Stat(name, is_dir, 0 if is_dir else size, self.shown.mode(is_dir, stamp.mode), self.shown.mtime_ns(stamp),
                    uid, gid, etag)

    async def stat(self, path: str) -> Stat:
        """A directory's, or a file's as an open would see it now (exact size, its etag)."""
        node = await self.resolve(path)
        name = _name(path)
        if node.is_dir:
            return self._stat(name, True, 0, node.stamp())
        opened = await self.open_node(node, path)  # type: ignore[arg-type]
        opened.close()
        return opened.stat

    async def listdir(self, path: str) -> list[Stat]:
        """The directory's entries, sorted by name; sizes the listing does not know are None."""
        return self._sorted(await self._rows(path))

    async def listdir_pages(self, path: str, page: int = 4096):
        """`listdir` a page at a time, for answers streamed as they are made: a directory of at
        most `page` entries in one page, sorted by name; a larger one page by page in the
        tree's order (a chunk directory's: grid order), so that only a page of entries is ever
        held (`zvfs serve`'s JSON of a chunk directory of 262,144 files, made whole, took the
        server to 245 MB under memory=64M: an outside attacker). Errors come with the first page."""
        rows = await self._rows(path)
        if len(rows) <= page:
            yield self._sorted(rows)
            return
        for start in range(0, len(rows), page):
            names, _, dirs, sizes, stamps, _ = rows.window(start, min(start + page, len(rows)))
            yield [self._stat(*entry) for entry in zip(names, dirs, sizes, stamps)]

    def _sorted(self, rows) -> list[Stat]:
        names, _, dirs, sizes, stamps, _ = rows.window(0, len(rows))
        # (rows come in the tree's order: a chunk directory's in grid order, `1.0` before `0.4`)
        order = sorted(range(len(names)), key=names.__getitem__)
        return [self._stat(names[i], dirs[i], sizes[i], stamps[i]) for i in order]

    async def _rows(self, path: str):
        node = await self.resolve(path)
        if not node.is_dir:
            raise _error(errno.ENOTDIR, path)
        if self.public and not self.shown.public(True, node.stamp().mode):
            raise _error(errno.EACCES, path)
        return await node.rows()  # type: ignore[union-attr]

    async def open(self, path: str) -> OpenFile:
        node = await self.resolve(path)
        if node.is_dir:
            raise _error(errno.EISDIR, path)
        return await self.open_node(node, path)  # type: ignore[arg-type]

    async def open_node(self, file: File, path: str) -> OpenFile:
        """`open` of a file already resolved (`resolve(path)`)."""
        try:
            handle = await file.open()
        except Gone:
            raise _error(errno.ENOENT, path) from None
        try:
            if self.public and not self.shown.public(False, file.stamp().mode):  # (as the open found it)
                raise _error(errno.EACCES, path)
            size = handle.size if handle.size is not None else await file.size()
            return OpenFile(self._stat(_name(path), False, size, file.stamp(), self._etag(handle, path)), handle)
        except BaseException:
            handle.release()
            raise

    def _etag(self, handle: Handle, path: str) -> str | None:
        """The version of the bytes a path holds: the store version the handle reads (a chunk
        file's is its shard's, so the path names the place in it) and what else decides the
        bytes (`_salt`); rewritten metadata by its bytes. None: versions cannot be told apart."""
        if isinstance(handle, BytesHandle):
            what: bytes = handle.data
        elif handle.token is None:
            return None
        else:
            what = f"{self._salt}{'/'.join(parts_of(path))}\0{_token_text(handle.token)}".encode("utf-8", "surrogateescape")
        return hashlib.blake2b(what, digest_size=16).hexdigest()


def _name(path: str) -> str:
    parts = parts_of(path)
    return parts[-1] if parts else ""


def _token_text(token: Hashable) -> str:
    return token.hex() if isinstance(token, bytes) else repr(token)
