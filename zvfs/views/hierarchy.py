"""Shared shape of the array views: an array model hierarchy (formats/array.py, any store
kind) shown in one format (Zarr v2, N5, Zarr v3 of a kind that is not Zarr): every group is a
directory with that format's metadata files, every array the format can express is a
directory with metadata files and a chunk space; arrays it cannot express are absent (and
logged once). Unlike the Zarr v3 view of a Zarr store nothing else passes through: the result
is a clean store of the format. A root array the view cannot express refuses
the mount (MetadataError) instead of mounting a root that is ENOENT. A view may name a group's
children differently from the store (`child_names`: the N5 view's s0, s1, ... levels).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import MetadataError
from ..formats.array import ArrayModel, ChunkSource, GroupModel, Hierarchy
from ..formats.zarr3 import child_path
from ..storage.base import Entry, Store
from ..storage.cache import CoalescingCache
from ..tree.nodes import BytesFile, Dir, Node, Rows, Stamp, Tree, stamp_of
from .chunks import ChunkSpace, Layout, MakeFile

if TYPE_CHECKING:
    from .transcode import Encoding

log = logging.getLogger("zvfs.view")


class NotExpressible(Exception):
    """Why an array is absent from a view (the log and `inspect --view` say it)."""


class HierarchyView:
    """Base of the array views. Subclasses give the metadata files and chunk naming."""

    name = ""

    def __init__(self, store: Store, nodes: Hierarchy, decoded: CoalescingCache, listings: CoalescingCache | None = None,
                 dirs: dict[str, Entry] | None = None):
        self.store = store
        self.nodes = nodes
        self.decoded = decoded
        self.dirs = dirs or {}  # store directory -> its entry (owner, bits, time)
        self.tree = Tree(listings)
        self.absent: dict[str, str] = {}  # array path -> why the view cannot express it
        self.encodings: dict[str, Encoding] = {}  # array path -> how the view writes its chunks
        for path, node in sorted(nodes.items()):
            if isinstance(node, ArrayModel):
                try:
                    if not isinstance(node.data_type, str):  # (an extension data type, as an object: zarr-python's datetime64)
                        raise NotExpressible(f"data type {str(node.data_type)[:100]} has no form in this view")
                    self.encodings[path] = self.encoding(node)
                except NotExpressible as e:
                    if path == "":  # a mount whose root would be ENOENT is refused
                        raise MetadataError(f"{store.display} (--view {self.name})", f"the root array cannot be shown: {e}") from None
                    self.absent[path] = str(e)
                    log.warning("%s view: array %s is not shown: %s", self.name, path, e)
        self.node_for("")

    def source(self, node: ArrayModel) -> ChunkSource:
        return node.chunks

    def node_for(self, path: str) -> Node | None:
        node = self.nodes[path]
        if isinstance(node, ArrayModel) and path in self.absent:
            return None
        if isinstance(node, GroupModel):
            return self.tree.intern((self.name, path), lambda ino: GroupDir(ino, self, node))
        return self.tree.intern((self.name, path), lambda ino: ArrayDir(ino, self, node))

    def stamp(self, path: str) -> Stamp:
        """What a directory shown for store directory `path` shows: that directory's."""
        return stamp_of(self.dirs.get(path))

    def chunk_stamp(self, node: ArrayModel) -> Stamp:
        """The chunk directories' stamp: the store's chunk directory (`c/`), or the array's."""
        below = child_path(node.path, node.chunk_dir) if node.chunk_dir else node.path
        return self.stamp(below if below in self.dirs else node.path)

    def metadata(self, key: str, content: bytes, node: ArrayModel | GroupModel) -> Node:
        """A metadata file, dressed in the mode and mtime of the metadata it came from."""
        return self.tree.intern((self.name, "meta", key), lambda ino: BytesFile(ino, content, node.version, self.store,
                                                                               node.meta_key))

    # -- for subclasses

    def encoding(self, node: ArrayModel) -> "Encoding":
        """How the view writes the array's chunks; NotExpressible if it cannot show it."""
        raise NotImplementedError

    def child_names(self, group: GroupModel) -> dict[str, str]:
        """The group's children: name in the view -> stored name (N5 renames OME levels)."""
        return {name: name for name in group.children}

    def group_files(self, group: GroupModel) -> dict[str, bytes]:
        raise NotImplementedError

    def array_files(self, node: ArrayModel) -> dict[str, bytes]:
        raise NotImplementedError

    def layout(self, node: ArrayModel) -> Layout:
        raise NotImplementedError

    def make_file(self, node: ArrayModel, source) -> MakeFile:
        enc = self.encodings[node.path]
        return lambda ino, ref, coords: enc.file(ino, self.store, ref, coords, self.decoded)


class GroupDir(Dir):
    __slots__ = ("view", "group")

    def __init__(self, ino: int, view: HierarchyView, group: GroupModel):
        super().__init__(ino)
        self.view = view
        self.group = group

    def stamp(self) -> Stamp:
        return self.view.stamp(self.group.path)

    def _files(self) -> dict[str, Node]:
        return {name: self.view.metadata(child_path(self.group.path, name), data, self.group)
                for name, data in self.view.group_files(self.group).items()}

    async def lookup(self, name: str) -> Node | None:
        files = self._files()
        if name in files:
            return files[name]
        stored = self.view.child_names(self.group).get(name)
        return None if stored is None else self.view.node_for(child_path(self.group.path, stored))

    async def entries(self) -> list[tuple[str, Node]]:
        out = list(self._files().items())
        for name, stored in self.view.child_names(self.group).items():
            node = self.view.node_for(child_path(self.group.path, stored))
            if node is not None:
                out.append((name, node))
        return sorted(out, key=lambda e: e[0])


class ArrayDir(Dir):
    __slots__ = ("view", "array", "chunks")

    def __init__(self, ino: int, view: HierarchyView, array: ArrayModel):
        super().__init__(ino)
        self.view = view
        self.array = array
        source = view.source(array)
        self.chunks = ChunkSpace(view.tree, source, view.layout(array), view.make_file(array, source),
                                 stamp=lambda: view.chunk_stamp(array), where=array.path, store=view.store)

    def stamp(self) -> Stamp:
        """The array directory's; it lists the first level of chunk names too (`narrow_top`)."""
        own = self.view.stamp(self.array.path)
        return own if self.chunks.layout.top else self.chunks.bits.narrow_top(own)

    async def ready(self) -> None:
        await self.chunks.bits.learn(())

    def _files(self) -> dict[str, Node]:
        return {name: self.view.metadata(child_path(self.array.path, name), data, self.array)
                for name, data in self.view.array_files(self.array).items()}

    async def lookup(self, name: str) -> Node | None:
        files = self._files()
        return files[name] if name in files else await self.chunks.top_lookup(name)

    async def entries(self) -> list[tuple[str, Node]]:
        return sorted([*self._files().items(), *await self.chunks.top_entries()], key=lambda e: e[0])

    async def rows(self) -> Rows:
        """The chunk rows (made a window at a time: no node per chunk) and the metadata files."""
        rows = await self.chunks.top_rows()
        for name, node in self._files().items():
            rows.add(name, node.ino, False, node.known_size(), node.stamp(), node.token())  # type: ignore[attr-defined]
        return rows
