"""The unsharded Zarr v3 view of a Zarr v3 hierarchy.

Groups, attributes and unsharded arrays are shown as stored. A sharded array becomes a
directory with a rewritten `zarr.json` (two fields change: the chunk shape becomes the
innermost chunk shape, the codecs become the transposes before sharding plus the inner codecs)
and one file per non-empty innermost chunk, named by the array's own `chunk_key_encoding`.
The chunk files' bytes are the inner chunks' bytes, unchanged.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
from typing import Callable, Iterable

import numpy as np

from ..formats.zarr3 import META, ArrayNode, GroupNode, ShardedArray, child_path, parse_array
from ..storage.base import Store
from ..storage.cache import CoalescingCache
from ..tree import BytesFile, Dir, InodeRange, ListedDir, Node, PassDir, RangeFile, Tree, grid_block_sizes, pass_node

log = logging.getLogger("zvfs.view.zarr3")


def metadata_bytes(meta: dict) -> bytes:
    """Serialise metadata the way zarr-python writes it (2-space indent)."""
    return json.dumps(meta, indent=2).encode()


def unsharded_metadata(node: ArrayNode) -> dict:
    """The `zarr.json` of the unsharded equivalent of a sharded array (key order kept)."""
    assert node.plan is not None
    meta = dict(node.meta)
    grid = dict(meta["chunk_grid"])
    grid["configuration"] = {**grid.get("configuration", {}), "chunk_shape": list(node.plan.chunk_shape)}
    meta["chunk_grid"] = grid
    meta["codecs"] = node.plan.codecs
    return meta


def unsharded_group_metadata(meta: dict, where: str) -> dict:
    """A group's `zarr.json` with its consolidated array entries rewritten like the arrays
    themselves; otherwise zarr-python would read inner chunks as shards."""
    cm = meta.get("consolidated_metadata")
    if not isinstance(cm, dict) or not isinstance(cm.get("metadata"), dict):
        return meta
    entries = {}
    for path, m in cm["metadata"].items():
        if isinstance(m, dict) and m.get("node_type") == "array":
            node = parse_array(path, m, f"{where} (consolidated entry {path!r})")
            if node.plan is not None:
                m = unsharded_metadata(node)
        entries[path] = m
    return {**meta, "consolidated_metadata": {**cm, "metadata": entries}}


def parse_coord(name: str) -> int | None:
    """A canonical non-negative decimal ("0", "17"; not "017", "+1", "1 ")."""
    if not name.isascii() or not name.isdigit() or (len(name) > 1 and name[0] == "0"):
        return None
    return int(name)


class Zarr3View:
    """Builds the view's tree lazily from a loaded hierarchy."""

    def __init__(self, store: Store, nodes: dict[str, ArrayNode | GroupNode], cache: CoalescingCache):
        self.store = store
        self.nodes = nodes
        self.cache = cache
        self.tree = Tree()
        #: extra virtual children of a group (by group path): ZVF's `objects/`
        self.extras: Callable[[str], list[tuple[str, Node]]] = lambda path: []
        self.node_for("")

    def node_for(self, path: str) -> Node:
        def make(ino: int) -> Node:
            h = self.nodes[path]
            if isinstance(h, GroupNode):
                return GroupDir(ino, self, h)
            if h.plan is not None:
                return ShardedArrayDir(ino, self, ShardedArray(h, self.store, self.cache))
            return PassDir(ino, self.tree, self.store, path)

        return self.tree.intern(("zarr", path), make)

    def metadata_file(self, path: str, meta: dict) -> BytesFile:
        return self.tree.intern(("meta", path), lambda ino: BytesFile(ino, metadata_bytes(meta)))  # type: ignore[return-value]


class GroupDir(ListedDir):
    """A group: its own (possibly rewritten) `zarr.json`, its child nodes, and whatever else
    the store holds there, shown as stored."""

    __slots__ = ("view", "group")

    def __init__(self, ino: int, view: Zarr3View, group: GroupNode):
        super().__init__(ino)
        self.view = view
        self.group = group

    def _meta_file(self) -> Node:
        view, group = self.view, self.group
        meta = unsharded_group_metadata(group.meta, f"{view.store.display}/{child_path(group.path, META)}")
        if meta is group.meta:  # nothing to rewrite: the stored bytes, unchanged
            return view.tree.intern(("meta", group.path), lambda ino: BytesFile(ino, group.raw))
        return view.metadata_file(group.path, meta)

    async def lookup(self, name: str) -> Node | None:
        """Metadata and child nodes are known from the hierarchy: no listing needed."""
        if name == META:
            return self._meta_file()
        if name in self.group.children:
            return self.view.node_for(child_path(self.group.path, name))
        return await super().lookup(name)

    async def list_children(self) -> Iterable[tuple[str, Node]]:
        view, path = self.view, self.group.path
        out = []
        for e in await view.store.list(path) or []:
            sub = child_path(path, e.name)
            if e.name == META and not e.is_dir:
                out.append((e.name, self._meta_file()))
            elif e.name in self.group.children:
                out.append((e.name, view.node_for(sub)))
            else:
                out.append((e.name, pass_node(view.tree, view.store, sub, e.is_dir, e.size)))
        taken = {name for name, _ in out}
        return out + [(name, node) for name, node in view.extras(path) if name not in taken]


class ShardedArrayDir(Dir):
    """A sharded array shown unsharded: `zarr.json` plus the chunk key tree."""

    __slots__ = ("view", "array", "chunks")

    def __init__(self, ino: int, view: Zarr3View, array: ShardedArray):
        super().__init__(ino)
        self.view = view
        self.array = array
        self.chunks = ChunkSpace(view, array)

    def _meta(self) -> BytesFile:
        return self.view.metadata_file(self.array.node.path, unsharded_metadata(self.array.node))

    async def lookup(self, name: str) -> Node | None:
        if name == META:
            return self._meta()
        return await self.chunks.top_lookup(name)

    async def entries(self) -> list[tuple[str, Node]]:
        return sorted([(META, self._meta()), *await self.chunks.top_entries()], key=lambda e: e[0])


class ChunkSpace(InodeRange):
    """Names, inode numbers and nodes of one array's chunk files and chunk directories.

    With a `/` separator the keys are nested directories (`c/0/4/1/7`, or `0/4/1/7` for the v2
    encoding); with `.` they are flat names in the array directory (`c.0.4.1.7`, `0.4.1.7`).
    A directory at depth d is identified by its d leading grid coordinates, a file by all of
    them; numbers are assigned per depth in C order over the grid prefix.
    """

    def __init__(self, view: Zarr3View, array: ShardedArray):
        self.view = view
        self.array = array
        self.ndim = array.ndim
        self.grid = array.grid
        enc = array.node.encoding
        self.nested = enc.separator == "/" and self.ndim > 0
        self.c_dir = self.nested and enc.name == "default"
        sizes = grid_block_sizes(self.grid)
        self.depth_start = list(itertools.accumulate([0, *sizes[:-1]]))
        self.count = sum(sizes)
        self.start = view.tree.reserve(self)

    # -- numbering

    def ino_of(self, prefix: tuple[int, ...]) -> int:
        d = len(prefix)
        lin = int(np.ravel_multi_index(prefix, self.grid[:d])) if d else 0
        return self.start + self.depth_start[d] + lin

    async def node_at(self, offset: int) -> Node | None:
        d = bisect.bisect_right(self.depth_start, offset) - 1
        lin = offset - self.depth_start[d]
        prefix = tuple(int(i) for i in np.unravel_index(lin, self.grid[:d])) if d else ()
        if d == self.ndim:
            return await self.file(prefix)
        if self.nested and (d > 0 or self.c_dir):
            return ChunkDir(self.ino_of(prefix), self, prefix)
        return None

    # -- nodes

    async def file(self, coords: tuple[int, ...]) -> Node | None:
        ref = await self.array.locate(coords)
        return None if ref is None else RangeFile(self.ino_of(coords), self.array.store, ref)

    async def child(self, prefix: tuple[int, ...], name: str) -> Node | None:
        """Lookup inside a nested chunk directory. Intermediate directories are answered from
        the grid alone (no index read), so opening a chunk by name costs one index lookup."""
        i = parse_coord(name)
        d = len(prefix)
        if i is None or i >= self.grid[d]:
            return None
        coords = (*prefix, i)
        if d + 1 == self.ndim:
            return await self.file(coords)
        return ChunkDir(self.ino_of(coords), self, coords)

    async def present(self, prefix: tuple[int, ...]) -> np.ndarray:
        """Grid coordinates of every non-empty chunk whose leading coordinates are `prefix`,
        sorted in C order, taken from the shard indexes."""
        found = [await self.array.chunks_in_shard(s) for s in self.array.shards_touching(prefix)]
        coords = np.concatenate(found) if found else np.zeros((0, self.ndim), dtype=np.int64)
        if prefix:
            coords = coords[np.all(coords[:, : len(prefix)] == np.array(prefix), axis=1)]
        return coords[np.lexsort(coords.T[::-1])] if len(coords) and self.ndim else coords

    async def children(self, prefix: tuple[int, ...]) -> list[tuple[str, Node]]:
        d = len(prefix)
        coords = await self.present(prefix)
        if d + 1 == self.ndim:
            return [(str(c[-1]), n) for c in coords for n in [await self.file(tuple(int(v) for v in c))] if n]
        return [(str(i), ChunkDir(self.ino_of((*prefix, int(i))), self, (*prefix, int(i)))) for i in np.unique(coords[:, d])]

    # -- the array directory's own level

    async def top_lookup(self, name: str) -> Node | None:
        if self.c_dir:
            return ChunkDir(self.ino_of(()), self, ()) if name == "c" else None
        if self.nested:
            return await self.child((), name)
        parts = name.split(".")
        if self.array.node.encoding.name == "default":
            if parts[0] != "c":
                return None
            parts = parts[1:]
        elif self.ndim == 0:
            parts = [] if parts == ["0"] else ["not a chunk"]
        coords = tuple(parse_coord(p) for p in parts)
        if len(coords) != self.ndim or None in coords or not self.array.in_grid(coords):  # type: ignore[arg-type]
            return None
        return await self.file(coords)  # type: ignore[arg-type]

    async def top_entries(self) -> list[tuple[str, Node]]:
        if self.c_dir:
            return [("c", ChunkDir(self.ino_of(()), self, ()))] if all(self.grid) else []
        if self.nested:
            return await self.children(())
        key = self.array.node.encoding.key
        coords = await self.present(())
        return [(key(c), n) for c in map(lambda r: tuple(int(v) for v in r), coords) for n in [await self.file(c)] if n]


class ChunkDir(Dir):
    __slots__ = ("space", "prefix")

    def __init__(self, ino: int, space: ChunkSpace, prefix: tuple[int, ...]):
        super().__init__(ino)
        self.space = space
        self.prefix = prefix

    async def lookup(self, name: str) -> Node | None:
        return await self.space.child(self.prefix, name)

    async def entries(self) -> list[tuple[str, Node]]:
        return sorted(await self.space.children(self.prefix), key=lambda e: e[0])
