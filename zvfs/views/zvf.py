"""`objects/` in each level of a ZVF store: one `<oid>.npy` per object.

Each file holds the object's vertex rows, assembled through its manifest (see
formats/zvf.py; cells read through the arrays' models), as numpy.save writes them; so `cp objects/123.npy .` pulls one streamline out
of a sharded store. Objects with an empty manifest (ids dropped at coarser levels) are absent.
Looking a file up by name reads one manifest chunk; only listing reads them all.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

from ..formats.array import Hierarchy
from ..formats.chunkref import ChunkRef
from ..formats.zvf import ObjectReader, ZvfLevel, find_levels, npy_header
from ..storage.cache import CoalescingCache
from ..tree.handles import BytesHandle, Handle, read_ref
from ..tree.nodes import File, ListedDir, Node, Stamp
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

    async def read_cell(self, ref: ChunkRef) -> bytes:
        return await read_ref(self.view.store, ref)

    def object_stamp(self, level: str) -> Stamp:
        """An object file's: the level's directory, with only the bits that every array it is
        read from (and their chunk directories) also has."""
        stamp = self.view.stamp(level)
        mode = stamp.mode
        for path, entry in self.view.dirs.items():
            if mode is not None and entry.mode is not None and path.startswith(f"{level}/" if level else ""):
                mode &= entry.mode
        return stamp._replace(mode=mode)

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

    def stamp(self) -> Stamp:
        return self.objects.view.stamp(self.reader.level.path)

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

    def stamp(self) -> Stamp:
        return self.objects.object_stamp(self.reader.level.path)

    async def open(self) -> Handle:
        """The object's rows as they are now (each chunk at its shard's current version; the
        decoded cells are kept per version)."""
        rows = await self.reader.vertices(await self.reader.manifest(self.row))
        data = npy_header(rows.dtype, rows.shape) + rows.tobytes()
        return BytesHandle(data, hashlib.blake2b(data, digest_size=16).digest())

    async def size(self) -> int:
        level: ZvfLevel = self.reader.level
        plan = await self.reader.row_indices(await self.reader.manifest(self.row))
        n = sum(len(idx) for _, idx in plan)
        return len(npy_header(level.dtype, (n, level.ndim))) + n * level.ndim * level.dtype.itemsize
