"""`objects/` in each level of a ZVF store: one `<oid>.npy` per object.

Each file holds the object's vertex rows, assembled through its manifest (see
formats/zvf.py; cells read through the arrays' models), as numpy.save writes them; so `cp objects/123.npy .` pulls one streamline out
of a sharded store. Objects with an empty manifest (ids dropped at coarser levels) are absent.
Looking a file up by name reads one manifest chunk; only listing reads them all.
"""

from __future__ import annotations

from typing import Iterable

from ..formats.array import ArrayModel, Hierarchy
from ..formats.zvf import ObjectReader, ZvfLevel, find_levels, npy_header
from ..storage.cache import CoalescingCache
from ..tree import File, ListedDir, Node, RangeFile
from .chunks import parse_coord
from .zarr3 import Zarr3View

OBJECTS = "objects"


class ZvfObjects:
    """Adds `objects/` to the level groups of a Zarr3View over a ZVF store."""

    def __init__(self, view: Zarr3View, arrays: Hierarchy, decoded: CoalescingCache):
        self.view = view
        self.arrays = arrays
        self.decoded = decoded
        self.levels = {lv.path: lv for lv in find_levels(arrays)}
        view.extras = self.extras

    async def read_cell(self, node: ArrayModel, cell: tuple[int, ...]) -> bytes | None:
        ref = await node.chunks.locate(cell)
        return None if ref is None else await RangeFile(0, self.view.store, ref).read(0, ref.length)

    def extras(self, group_path: str) -> list[tuple[str, Node]]:
        level = self.levels.get(group_path)
        if level is None:
            return []
        reader = ObjectReader(level, self.arrays, self.read_cell, self.decoded)
        return [(OBJECTS, self.view.tree.intern(("zvfobjects", group_path), lambda ino: ObjectsDir(ino, self, reader)))]


class ObjectsDir(ListedDir):
    __slots__ = ("objects", "reader")

    def __init__(self, ino: int, objects: ZvfObjects, reader: ObjectReader):
        super().__init__(ino)
        self.objects = objects
        self.reader = reader

    def _file(self, oid: int, row: int) -> Node:
        key = ("zvfobj", self.reader.level.path, oid)
        return self.objects.view.tree.intern(key, lambda ino: ObjectFile(ino, self.objects, self.reader, row))

    async def lookup(self, name: str) -> Node | None:
        if self._entries is not None:
            return self._by_name.get(name)
        oid = parse_coord(name[:-4]) if name.endswith(".npy") else None
        if oid is None:
            return None
        row = await self.reader.row_of(oid)
        if row is None or not self.reader.blocks(await self.reader.manifest(row)):
            return None
        return self._file(oid, row)

    async def list_children(self) -> Iterable[tuple[str, Node]]:
        ids = await self.reader.ids()
        blobs = await self.reader.manifests()
        return [(f"{int(oid)}.npy", self._file(int(oid), row)) for row, (oid, blob) in enumerate(zip(ids, blobs))
                if self.reader.blocks(blob)]


class ObjectFile(File):
    __slots__ = ("objects", "reader", "row")

    def __init__(self, ino: int, objects: ZvfObjects, reader: ObjectReader, row: int):
        super().__init__(ino)
        self.objects = objects
        self.reader = reader
        self.row = row

    async def _bytes(self) -> bytes:
        async def load() -> bytes:
            rows = await self.reader.vertices(await self.reader.manifest(self.row))
            return npy_header(rows.dtype, rows.shape) + rows.tobytes()

        return await self.objects.decoded.get(("zvfobj", self.reader.level.path, self.row), load)

    async def size(self) -> int:
        level: ZvfLevel = self.reader.level
        plan = await self.reader.row_indices(await self.reader.manifest(self.row))
        n = sum(len(idx) for _, idx in plan)
        return len(npy_header(level.dtype, (n, level.ndim))) + n * level.ndim * level.dtype.itemsize

    async def read(self, offset: int, size: int) -> bytes:
        return (await self._bytes())[offset : offset + size]
