"""ZVF (Zarr Vectors) stores: per-object read plans through the object manifest.

A ZVF store is a Zarr v3 hierarchy, so the unsharded twin is the generic Zarr v3 view. What
this module adds is the object: `object_index/manifests` names, per object, the chunks and
the fragments in each chunk that hold its vertex rows (ZVF 0.6+ manifest). Reading an object
is: manifest -> for each block, that chunk's `vertex_fragments` cell (fragment -> rows) and
`vertices` cell (rows) -> the rows, concatenated in manifest order.

The cells are read through the arrays' models (formats/array.py: the chunk sources the views
use, so sharded and unsharded arrays, local and remote stores, all take the same path and the
same caches); blob formats are decoded by zarr-vectors' own decoders and the codecs by
formats/codecs.py.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from ..errors import CorruptShardError
from ..storage.base import Version
from ..storage.cache import CoalescingCache
from .array import ArrayModel, GroupModel, Hierarchy
from .chunkref import ChunkRef
from .codecs import Chain, decode_step, undecodable
from .zarr3 import child_path

VERTICES = "vertices"
VERTEX_FRAGMENTS = "vertex_fragments"
OBJECT_INDEX = "object_index"
MANIFESTS = "object_index/manifests"
OBJECT_IDS = "object_index/object_ids"

#: reads the whole chunk of an array at grid `cell`; None if absent
CellReader = Callable[[ChunkRef], Awaitable[bytes]]  # a located chunk's stored bytes


def is_zvf_root(attributes: dict) -> bool:
    """The root group's attributes are a ZVF store's."""
    return isinstance(attributes.get("zarr_vectors"), dict)


@dataclass
class ZvfLevel:
    """One resolution level that has objects."""

    path: str
    sid_ndim: int
    ndim: int  # coordinates per vertex row
    dtype: np.dtype
    origin: tuple[int, ...]  # chunk_grid_origin of the per-chunk arrays (cell = coords - origin)
    num_rows: int
    has_id_table: bool
    manifests_per_chunk: int


def find_levels(nodes: Hierarchy) -> list[ZvfLevel]:
    root_attrs = nodes[""].attributes.get("zarr_vectors", {})
    ndim = len(root_attrs.get("chunk_shape") or [0, 0, 0])
    out = []
    for path, node in sorted(nodes.items()):
        if not isinstance(node, GroupModel) or "zarr_vectors_level" not in node.attributes:
            continue
        oi = nodes.get(child_path(path, OBJECT_INDEX))
        manifests = nodes.get(child_path(path, MANIFESTS))
        vertices = nodes.get(child_path(path, VERTICES))
        if not (isinstance(oi, GroupModel) and isinstance(manifests, ArrayModel) and isinstance(vertices, ArrayModel)):
            continue
        oattrs = oi.attributes
        vattrs = vertices.attributes
        sid_ndim = int(oattrs.get("sid_ndim", ndim))
        origin = tuple(vattrs.get("chunk_grid_origin") or [0] * len(vertices.shape))
        out.append(ZvfLevel(
            path=path, sid_ndim=sid_ndim, ndim=ndim, dtype=np.dtype(vattrs.get("dtype", "float32")).newbyteorder("<"),
            origin=origin, num_rows=int(manifests.shape[0]) if manifests.shape else 0,
            has_id_table=isinstance(nodes.get(child_path(path, OBJECT_IDS)), ArrayModel),
            manifests_per_chunk=manifests.chunk_shape[0],
        ))
    return out


@dataclass(frozen=True, slots=True)
class DecodedCell:
    """A decoded chunk kept in the decoded-data cache, with the bytes it holds and the version
    of the shard it came from."""

    values: np.ndarray
    nbytes: int
    version: Version | None = None


class ObjectReader:
    """Object ids, manifests and vertex rows of one level, read through `read_cell`.

    Decoded cells (a manifests chunk holds 16384 objects) are kept in `cache`, per version of
    their shard, so listing or sizing many objects decodes each cell once, and a rewritten
    shard is read again."""

    def __init__(self, level: ZvfLevel, nodes: Hierarchy, read_cell: CellReader, cache: CoalescingCache):
        self.level = level
        self.nodes = nodes
        self.read_cell = read_cell
        self.cache = cache

    def _node(self, name: str) -> ArrayModel:
        return self.nodes[child_path(self.level.path, name)]  # type: ignore[return-value]

    async def _cell(self, name: str, cell: tuple[int, ...]) -> np.ndarray | None:
        node = self._node(name)
        ref = await node.chunks.locate(cell)
        if ref is None:
            return None
        tag = None if ref.version is None else ref.version.tag
        found = await self.cache.get(("zvfcell", ref.key, tag, ref.offset), lambda: self._decode_cell(node, cell, ref))
        return found.values

    async def _decode_cell(self, node: ArrayModel, cell: tuple[int, ...], ref: ChunkRef) -> DecodedCell:
        raw = await self.read_cell(ref)
        chain = Chain.parse(node.codecs, node.data_type, node.ndim)
        if chain is None:
            raise CorruptShardError(node.path, undecodable(node.codecs, node.data_type))
        try:
            values = (await decode_step(chain.decode, raw, node.data_type, node.chunk_shape)).reshape(-1)
        except (ValueError, RuntimeError, TypeError) as e:
            raise CorruptShardError(node.path, f"chunk {cell} does not decode ({e})") from None
        if values.dtype == object:
            return DecodedCell(values, sum(len(v) for v in values) + 64 * len(values), ref.version)
        return DecodedCell(values, values.nbytes, ref.version)

    async def ids(self) -> np.ndarray:
        """Object id of each manifest row (the row number itself without an id table)."""
        if not self.level.has_id_table:
            return np.arange(self.level.num_rows, dtype=np.int64)
        node = self._node(OBJECT_IDS)
        per = node.chunk_shape[0]
        parts = []
        for c in range(-(-self.level.num_rows // per)):
            cell = await self._cell(OBJECT_IDS, (c,))
            n = min(per, self.level.num_rows - c * per)
            parts.append(np.zeros(n, np.int64) if cell is None else cell[:n].astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    async def row_of(self, oid: int) -> int | None:
        ids = await self.ids()
        rows = np.flatnonzero(ids == oid)
        return int(rows[0]) if len(rows) else None

    async def manifest(self, row: int) -> bytes:
        per = self.level.manifests_per_chunk
        cell = await self._cell(MANIFESTS, (row // per,))
        return b"" if cell is None else bytes(cell[row % per])

    async def manifests(self) -> list[bytes]:
        per, n = self.level.manifests_per_chunk, self.level.num_rows
        out: list[bytes] = []
        for c in range(-(-n // per)):
            cell = await self._cell(MANIFESTS, (c,))
            count = min(per, n - c * per)
            out += [b""] * count if cell is None else [bytes(b) for b in cell[:count]]
        return out

    def blocks(self, blob: bytes):
        from zarr_vectors.encoding.fragments import decode_object_manifest_blocks

        if len(blob) < 4 or blob[:4] == b"\0\0\0\0":
            return []
        try:
            return decode_object_manifest_blocks(blob, sid_ndim=self.level.sid_ndim)
        except Exception as e:  # noqa: BLE001 - any decoder failure is corrupt input
            raise CorruptShardError(self._node(MANIFESTS).path, f"object manifest does not decode ({e})") from None

    async def _fragments(self, coords: tuple[int, ...]):
        from zarr_vectors.encoding.fragments import decode_fragments

        cell = self._cell_of(coords)
        found = await self._cell(VERTEX_FRAGMENTS, cell)
        if found is None:
            raise CorruptShardError(self._node(VERTEX_FRAGMENTS).path, f"manifest names chunk {coords}, which holds no fragments")
        try:
            return decode_fragments(bytes(found[0]))
        except Exception as e:  # noqa: BLE001
            raise CorruptShardError(self._node(VERTEX_FRAGMENTS).path, f"fragment index of chunk {coords} does not decode ({e})") from None

    def _cell_of(self, coords: tuple[int, ...]) -> tuple[int, ...]:
        origin = self.level.origin[-len(coords):] if len(self.level.origin) >= len(coords) else (0,) * len(coords)
        return tuple(int(c) - int(o) for c, o in zip(coords, origin))

    async def row_indices(self, blob: bytes) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """The read plan: (chunk coords, vertex row indices in that chunk) in manifest order."""
        plan = []
        for coords, ref in self.blocks(blob):
            fi = await self._fragments(tuple(coords))
            if isinstance(ref, int):
                frags = [ref]
            elif isinstance(ref, tuple):
                frags = range(ref[0], ref[0] + ref[1])
            else:
                frags = [int(f) for f in ref]
            for f in frags:
                if not 0 <= f < fi.num_fragments:
                    raise CorruptShardError(self._node(VERTEX_FRAGMENTS).path, f"fragment {f} of chunk {coords} does not exist")
                plan.append((tuple(coords), np.asarray(fi.indices(f), dtype=np.int64)))
        return plan

    async def vertices(self, blob: bytes) -> np.ndarray:
        rows = []
        cache: dict[tuple[int, ...], np.ndarray] = {}
        for coords, idx in await self.row_indices(blob):
            if coords not in cache:
                cell = await self._cell(VERTICES, self._cell_of(coords))
                payload = b"" if cell is None else bytes(cell[0])
                cache[coords] = np.frombuffer(payload, dtype=self.level.dtype).reshape(-1, self.level.ndim)
            block = cache[coords]
            if len(idx) and (idx.max() >= len(block) or idx.min() < 0):
                raise CorruptShardError(self._node(VERTICES).path, f"fragment rows past the end of chunk {coords}")
            rows.append(block[idx])
        if not rows:
            return np.zeros((0, self.level.ndim), dtype=self.level.dtype)
        return np.concatenate(rows)


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The exact header numpy.save writes for an array of this dtype and shape."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    return buf.getvalue()
