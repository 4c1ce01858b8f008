"""One array model for every store kind: what a view needs to present an array, whatever
stored it.

A store kind's formats module turns its metadata into `ArrayModel`s and `GroupModel`s (a
Zarr v3 array, a Neuroglancer precomputed volume scale, a ZVF array); a view (zarr3, zarr2,
n5) presents any of them without reading the kind's own metadata. The model's chunks are the
chunks the views show (the inner chunks of a sharded array): `chunks.locate(coords)` says
where one chunk's bytes are, and `codecs` says what those bytes are once the ref's `decode`
step has run, as a Zarr v3 codec list (`transpose` + `bytes` for a precomputed raw chunk,
which is Fortran-ordered little-endian).

`cropped_edges`: the chunks at the array's upper end hold only the part inside the array
(precomputed, N5) instead of a full chunk padded with the fill value (Zarr). A view whose
format needs the other form pads or crops those chunks; interior chunks pass through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..storage.base import Version
from .chunkref import ChunkRef


class ChunkTableLike(Protocol):
    """A batch of stored chunks (formats.zarr3.ChunkTable is the implementation): `coords`
    (m, ndim) in C order (listings find a directory's rows by bisection)."""

    coords: np.ndarray
    lengths: np.ndarray
    version: Version | None

    def ref(self, i: int) -> ChunkRef: ...


class ChunkSource(Protocol):
    """Where an array's chunks are: the chunk grid, one chunk by grid position, and the stored
    chunks under fixed coordinates (for listings)."""

    grid: tuple[int, ...]
    ndim: int

    def in_grid(self, coords: tuple[int, ...]) -> bool: ...

    async def locate(self, coords: tuple[int, ...]) -> ChunkRef | None: ...

    async def tables(self, fixed: dict[int, int]) -> list[ChunkTableLike]: ...


@dataclass
class ArrayModel:
    path: str  # in the hierarchy the views show: "" for a root array, else "a/b"
    shape: tuple[int, ...]
    data_type: str  # Zarr v3 data type name
    chunk_shape: tuple[int, ...]  # the chunks the views show
    codecs: list  # Zarr v3 codecs of a chunk's bytes after `ChunkRef.decode`
    fill_value: Any  # Zarr v3 JSON form
    chunks: ChunkSource
    dimension_names: tuple[str | None, ...] | None = None
    attributes: dict = field(default_factory=dict)  # user attributes (resolution, offset, OME)
    cropped_edges: bool = False
    separator: str = "/"  # chunk key separator the store uses ("/" or ".")
    chunk_dir: str = ""  # the store directory below the array's that holds its chunk keys ("c"), if any
    version: Version | None = None  # of the metadata file it came from (mtime and mode of views' metadata)
    meta_key: str | None = None  # the store key of that file (its bits are followed: BytesFile)
    warning: str | None = None  # why a view cannot show it chunk by chunk (shown as stored, or absent)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunk_shape))

    def chunk_extent(self, coords: tuple[int, ...]) -> tuple[int, ...]:
        """The part of chunk `coords` inside the array (the stored shape when `cropped_edges`)."""
        return tuple(min(c, s - i * c) for c, s, i in zip(self.chunk_shape, self.shape, coords))


@dataclass
class GroupModel:
    path: str
    attributes: dict = field(default_factory=dict)
    children: list[str] = field(default_factory=list)  # names of child arrays and groups
    version: Version | None = None
    meta_key: str | None = None


Hierarchy = dict[str, "ArrayModel | GroupModel"]


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D integer array. (`np.unique` imports `numpy.ma` on
    its first call: 80 ms of the first listing of every mount, more than the listing.)"""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values
