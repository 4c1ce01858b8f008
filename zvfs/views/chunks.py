"""One array's chunk files and chunk directories, for every view.

A view decides how chunk files are named (`Layout`: nested directories naming one array axis
per level, in the view's own axis order, or flat names in the array directory) and what a
chunk file holds (`make_file`: the chunk's bytes passed through, transcoded, or an N5 block).
The chunks themselves come from the array model's ChunkSource (formats/array.py: a sharded
array's shard indexes, an unsharded array's keys, a precomputed scale's shards).

Inode numbers are computed, not stored: a directory at depth d is numbered by its d path
coordinates, a file by all of them, per depth in C order of the path-ordered grid.

Listings for the kernel are made in chunkrows.py.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..formats.array import ChunkSource, distinct
from ..formats.array import ChunkTableLike as ChunkTable
from ..formats.chunkref import ChunkRef
from ..formats.zarr3 import ChunkKeyEncoding, parse_coord
from ..storage.base import Store
from ..tree.nodes import (
    NO_STAMP,
    Dir,
    File,
    InodeRange,
    Node,
    Rows,
    Stamp,
    Tree,
    grid_block_sizes,
)
from .chunkbits import ChunkBits
from .chunkrows import chunk_rows, leading_rows, matching_rows

#: (inode, where the chunk's bytes are (None: a fill block), grid coords) -> the file
MakeFile = Callable[[int, "ChunkRef | None", tuple[int, ...]], File]


@dataclass(frozen=True)
class Layout:
    """How chunk files are named.

    nested: `axes[i]` is the array axis whose coordinate names path level i (`top`, if set,
    is a directory holding the tree, like Zarr v3's `c`). flat: `prefix` + coordinates joined
    by `.` (`c.1.2`, `1.2`), and `zero_d` names the single chunk of a 0-d array.
    """

    nested: bool
    axes: tuple[int, ...]
    top: str | None = None
    prefix: str | None = None
    zero_d: str = "0"

    @classmethod
    def zarr(cls, encoding: ChunkKeyEncoding, ndim: int) -> "Layout":
        """Zarr keys: v3 `default` (`c/1/2` or `c.1.2`) or `v2` (`1/2`, `1.2`, the Zarr v2 view's)."""
        default = encoding.name == "default"
        nested = encoding.separator == "/" and ndim > 0
        return cls(nested, tuple(range(ndim)), "c" if nested and default else None,
                   "c" if default else None, "c" if default else "0")

    def flat_name(self, coords: tuple[int, ...]) -> str:
        if not coords:
            return self.zero_d
        return ".".join([*([self.prefix] if self.prefix else []), *map(str, coords)])

    def parse_flat(self, name: str, ndim: int) -> tuple[int, ...] | None:
        if ndim == 0:
            return () if name == self.zero_d else None
        parts = name.split(".")
        if self.prefix:
            if parts[0] != self.prefix:
                return None
            parts = parts[1:]
        coords = tuple(parse_coord(p) for p in parts)
        return coords if len(coords) == ndim and None not in coords else None  # type: ignore[return-value]


class ChunkSpace(InodeRange):
    """`plain`: the view's chunk files are the chunks' bytes as stored (their size is the
    index entry's length), so listings are computed from the chunk tables without a node per
    file."""

    def __init__(self, tree: Tree, source: ChunkSource, layout: Layout, make_file: MakeFile, plain: bool = False,
                 stamp: Callable[[], Stamp] = lambda: NO_STAMP, where: str = "", store: Store | None = None):
        self.source = source
        self.where = where  # the array's path, for messages
        #: the store's `c/` (or array directory), as it is now (read again when directory
        #: permissions change: `OpenSource.watch_permissions`): the chunk directories' times,
        #: and their bits where the store's keys are not nested
        self.stamp = stamp
        self.layout = layout
        self.make_file = make_file
        self.plain = plain
        self.ndim = source.ndim
        self.axes = layout.axes if layout.nested else tuple(range(self.ndim))
        #: the chunk directories' bits: those of the store directories they stand for
        self.bits = ChunkBits(source, store if layout.nested else None, self.axes, stamp, where)
        self.pgrid = tuple(source.grid[a] for a in self.axes)  # the grid in path order
        sizes = grid_block_sizes(self.pgrid)
        self.depth_start = list(itertools.accumulate([0, *sizes[:-1]]))
        self.count = sum(sizes)
        self.start = tree.reserve(self)
        self.tree = tree

    # -- numbering (path order)

    def ino_of(self, path: tuple[int, ...]) -> int:
        lin = 0
        for c, g in zip(path, self.pgrid):
            lin = lin * g + c
        return self.start + self.depth_start[len(path)] + lin

    def to_array(self, path: tuple[int, ...]) -> tuple[int, ...]:
        coords = [0] * self.ndim
        for a, c in zip(self.axes, path):
            coords[a] = c
        return tuple(coords)

    def to_path(self, coords) -> tuple[int, ...]:
        return tuple(int(coords[a]) for a in self.axes)

    async def node_at(self, offset: int) -> Node | None:
        d = bisect.bisect_right(self.depth_start, offset) - 1
        lin = offset - self.depth_start[d]
        path = []
        for g in reversed(self.pgrid[:d]):
            lin, c = divmod(lin, g)
            path.append(c)
        path = tuple(reversed(path))
        if d == self.ndim:
            return await self.file(self.to_array(path))
        if self.layout.nested and (d > 0 or self.layout.top):
            return ChunkDir(self.ino_of(path), self, path)
        return None

    # -- nodes

    async def file(self, coords: tuple[int, ...]) -> Node | None:
        ref = await self.source.locate(coords)
        return None if ref is None else self._made(self.make_file(self.ino_of(self.to_path(coords)), ref, coords), coords)

    def _made(self, node: File, coords: tuple[int, ...]) -> File:
        """A chunk file that can find its bytes again when its shard changes (at open)."""
        node.relocate = lambda: self.source.locate(coords)
        return node

    async def child(self, path: tuple[int, ...], name: str) -> Node | None:
        """Lookup inside a nested chunk directory. Intermediate directories are answered from
        the grid alone (no index read), so opening a chunk by name costs one index lookup."""
        i = parse_coord(name)
        d = len(path)
        if i is None or i >= self.pgrid[d]:
            return None
        path = (*path, i)
        if d + 1 == self.ndim:
            return await self.file(self.to_array(path))
        return ChunkDir(self.ino_of(path), self, path)

    async def present(self, path: tuple[int, ...]) -> list[tuple[ChunkTable, np.ndarray]]:
        """The chunks under a path prefix: per chunk table that can hold them, the table and
        its matching rows."""
        fixed = {self.axes[i]: c for i, c in enumerate(path)}
        leading = self.axes[:len(path)] == tuple(range(len(path)))  # the path fixes the first axes
        out = []
        for table in await self.source.tables(fixed):
            rows = leading_rows(table.coords, path) if leading else matching_rows(table.coords, fixed)
            if len(rows):
                out.append((table, rows))
        return out

    def _files(self, found: list[tuple[ChunkTable, np.ndarray]], name: Callable) -> list[tuple[str, Node]]:
        """File entries straight from the chunk tables (no per-file index lookup)."""
        out = []
        for table, rows in found:
            for i, c in zip(rows.tolist(), table.coords[rows].tolist()):
                path = self.to_path(c)
                coords = tuple(c)
                out.append((name(coords, path), self._made(self.make_file(self.ino_of(path), table.ref(i), coords), coords)))
        return out

    async def children(self, path: tuple[int, ...]) -> list[tuple[str, Node]]:
        d = len(path)
        found = await self.present(path)
        if d + 1 == self.ndim:
            return self._files(found, lambda coords, p: str(p[-1]))
        axis = self.axes[d]
        values = distinct(np.concatenate([t.coords[rows, axis] for t, rows in found])).tolist() if found else []
        for i in values:
            await self.bits.learn((*path, i))
        return [(str(i), ChunkDir(self.ino_of((*path, i)), self, (*path, i))) for i in values]

    async def rows(self, path: tuple[int, ...]) -> Rows:
        """The listing of a nested chunk directory for the kernel (chunkrows.py)."""
        return await chunk_rows(self, path, nested=True)

    async def top_rows(self) -> Rows:
        """The chunk part of the array directory's listing, for the kernel."""
        layout = self.layout
        if layout.nested:
            if layout.top:
                return Rows.of(await self.top_entries())
            return await chunk_rows(self, (), nested=True)
        return await chunk_rows(self, (), nested=False)

    # -- the array directory's own level

    async def top_lookup(self, name: str) -> Node | None:
        layout = self.layout
        if layout.nested:
            if layout.top:
                return ChunkDir(self.ino_of(()), self, ()) if name == layout.top else None
            return await self.child((), name)
        coords = layout.parse_flat(name, self.ndim)
        if coords is None or not self.source.in_grid(coords):
            return None
        return await self.file(coords)

    async def top_entries(self) -> list[tuple[str, Node]]:
        layout = self.layout
        if layout.nested:
            if layout.top:
                await self.bits.learn(())
                return [(layout.top, ChunkDir(self.ino_of(()), self, ()))] if all(self.pgrid) else []
            return await self.children(())
        return self._files(await self.present(()), lambda coords, p: layout.flat_name(coords))


class ChunkDir(Dir):
    __slots__ = ("space", "path")

    def __init__(self, ino: int, space: ChunkSpace, path: tuple[int, ...]):
        super().__init__(ino)
        self.space = space
        self.path = path

    def stamp(self) -> Stamp:
        return self.space.bits.stamp(self.path)

    async def ready(self) -> None:
        await self.space.bits.learn(self.path)

    async def lookup(self, name: str) -> Node | None:
        return await self.space.child(self.path, name)

    async def entries(self) -> list[tuple[str, Node]]:
        return sorted(await self.space.children(self.path), key=lambda e: e[0])

    async def rows(self) -> Rows:
        return await self.space.rows(self.path)
