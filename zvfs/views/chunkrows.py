"""Chunk directory listings for the kernel (`ChunkRows`): no Python object per entry past a
small directory's few thousand.

A directory's listing is made from the chunk tables a source hands over a few at a time
(`scan`: a shard index too large to hold is streamed in slices), kept as compact numpy data per
segment (a shard's span along the listed axis), and the kernel's rows are made a window at a
time from it. Files keep their rows of the chunk tables (sizes, where their bytes are) while
the listings of all open chunk directories fit their budget (`RowsBudget`: the listings cache's
size); past it only which positions hold a chunk is kept (sorted narrow integers, or a bitmap
where that is smaller; sizes are then asked by the kernel per file), and a listing that does
not fit even so is EIO with one log line saying which option to raise. A small directory of
plain files (`SMALL_LISTING`, the common case: a few shards' chunks) is made at once instead,
its rows as lists, within the same budget.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable

import numpy as np

from ..formats.array import distinct
from ..tree.nodes import File, HeldRows, ListingTooLarge, Rows, Stamp, stamp_of

if TYPE_CHECKING:
    from .chunks import ChunkSpace


async def chunk_rows(space: ChunkSpace, path: tuple[int, ...], nested: bool) -> ChunkRows:
    """The rows of `space`'s directory at `path` (nested: the values of the next path axis, or
    the files of the last; flat: every chunk file), made from the tables the source hands
    over (`scan`), a few at a time."""
    rows = ChunkRows(space, path, nested)
    build = _Build(rows, {space.axes[i]: c for i, c in enumerate(path)})
    try:
        scan = getattr(space.source, "scan", None)
        if scan is not None:
            await scan(build.fixed, build.add, build.wanted)
        else:
            for table in await space.source.tables(build.fixed):
                build.add(table)
        build.finish()
        if not rows.files:  # the bits of the directories listed (one span per shard along the axis)
            per = space.bits.per[rows.axis]  # type: ignore[index]
            for segment in rows.segments:
                values = rows.unplace(segment.seg, segment.presence.select(0, segment.count))  # type: ignore[union-attr]
                for v in distinct(values // per).tolist():
                    await space.bits.learn((*path, v * per))
    except BaseException:
        rows.release()
        raise
    return rows


def leading_rows(coords: np.ndarray, values: tuple[int, ...]) -> np.ndarray:
    """Rows of a table (C-sorted) whose first coordinates are `values`: one run, found by
    bisection, so a directory costs the log of its shard's chunk count, not a pass over them
    (a directory of 100 files in a shard of 10^5 chunks: 160 µs with a mask over the table)."""
    lo, hi = 0, len(coords)
    for axis, v in enumerate(values):
        column = coords[:, axis]
        lo = bisect.bisect_left(column, v, lo, hi)
        hi = bisect.bisect_right(column, v, lo, hi)
    return np.arange(lo, hi)


def matching_rows(coords: np.ndarray, fixed: dict[int, int]) -> np.ndarray:
    """Rows of a table with the `fixed` coordinates (axis -> value), anywhere in its order."""
    mask = None
    for axis, v in fixed.items():
        match = coords[:, axis] == v
        mask = match if mask is None else mask & match
    return np.arange(len(coords)) if mask is None else np.flatnonzero(mask)


# --------------------------------------------------------------------------- listings for the kernel


#: bytes counted per segment and per kept table besides their arrays (the Python objects)
_OBJECT_COST = 256
#: positions gathered for a segment are merged (sorted, repeats dropped) when there are this
#: many more than at the last merge
_MERGE_AT = 1 << 16
#: bits per block of a bitmap's rank directory (a window unpacks only the blocks it needs)
_RANK_BLOCK = 1 << 16
_RANK_BYTES = _RANK_BLOCK // 8
#: a directory of at most this many plain chunk files, from tables of at most _SMALL_BYTES in
#: all, is made in one pass over all its tables (`_Build._finish_small`): a directory of 64
#: files from 8 shards cost 283 us made segment by segment (numpy calls on 8-row arrays, a
#: table copy per shard), 95 us in one pass (`chunk_rows` + `window` of one directory of the
#: 4 KiB bench array, FUSE-free, best of 200). Larger listings, or ones that do not fit the rows
#: budget as lists, are made segment by segment, which keeps less per file
SMALL_LISTING = 4096
_SMALL_BYTES = 1 << 20
#: bytes counted per row of such a listing (its rows as Python lists)
_SMALL_ROW_COST = 160
#: a table a small listing keeps whole for its files (not a copy of the rows it lists) is at
#: most this many times the bytes of the rows it lists: the tree's recent listings (65,536
#: files) then hold at most ~256 bytes of tables per file (a shard's 8 of 64 chunks, as in a
#: 2-D array's row directory, are kept without a copy)
_KEEP_FACTOR = 8
#: the stamp of a file listed without its shard's version (not known without I/O): no bits;
#: its size is unknown too, so the kernel asks for its attributes before using them
_UNKNOWN = Stamp(mode=0)


def _narrow(span: int) -> np.dtype:
    """The smallest unsigned type holding every position below `span`."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if span <= int(np.iinfo(dtype).max) + 1:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def _bitmap_nbytes(span: int) -> int:
    """Bytes of a bitmap of positions [0, span): whole rank blocks past one block."""
    nbytes = -(-span // 8)
    return -(-nbytes // _RANK_BYTES) * _RANK_BYTES if span > _RANK_BLOCK else nbytes


def _bitmap(span: int) -> np.ndarray:
    return np.zeros(_bitmap_nbytes(span), np.uint8)


def _set_bits(bits: np.ndarray, pos: np.ndarray) -> None:
    pos = pos.astype(np.int64, copy=False)
    np.bitwise_or.at(bits, pos >> 3, np.right_shift(np.uint8(128), (pos & 7).astype(np.uint8)))


class _Positions:
    """The positions in [0, span) of one segment that hold an entry, while a listing is made
    (any order, repeats allowed): narrow integer parts, merged (sorted, repeats dropped) as
    they grow, or a bitmap over the span where that takes less."""

    __slots__ = ("span", "dtype", "parts", "merged", "added", "bits", "nbytes", "counted", "since")

    def __init__(self, span: int):
        self.span = span
        self.dtype = _narrow(span)
        self.parts: list[np.ndarray] = []
        self.merged = True  # parts is [] or [one sorted array without repeats]
        self.added = 0  # positions added since the last merge
        self.bits: np.ndarray | None = None
        self.nbytes = 0
        self.counted = self.since = 0  # positions held at the last `holds_all` count, added since

    def add(self, pos: np.ndarray) -> None:
        self.since += len(pos)
        if self.bits is not None:
            _set_bits(self.bits, pos)
            return
        part = pos.astype(self.dtype, copy=False)
        self.parts.append(part)
        self.merged = len(self.parts) == 1 and len(part) < 2
        self.added += len(part)
        self.nbytes += part.nbytes
        if self.added >= max(_MERGE_AT, len(self.parts[0])):
            self.merge()

    def merge(self) -> None:
        if self.bits is not None or self.merged:
            return
        pos = distinct(np.concatenate(self.parts)) if len(self.parts) > 1 else distinct(self.parts[0])
        self.parts, self.merged, self.added = [pos], True, 0
        self.nbytes = pos.nbytes
        if pos.nbytes > _bitmap_nbytes(self.span):
            self.bits = _bitmap(self.span)
            _set_bits(self.bits, pos)
            self.parts, self.nbytes = [], self.bits.nbytes

    def holds_all(self, size: int) -> bool:
        """Whether every position of [0, size) is held. Counted (merged first) only once enough
        were added since the last count to fill it, and a quarter as many as it found: a
        count per add merged everything held each time (a segment one position short, added
        to one repeat at a time, would cost a merge of it per add)."""
        if self.since < max(size - self.counted, self.counted // 4, 1):
            return False
        self.merge()
        if self.bits is not None:
            self.counted = int(np.bitwise_count(self.bits).sum())
        else:
            self.counted = len(self.parts[0]) if self.parts else 0
        self.since = 0
        return self.counted >= size

    def presence(self) -> "_Presence":
        self.merge()
        if self.bits is not None:
            return _Presence(None, self.bits)
        return _Presence(self.parts[0] if self.parts else np.zeros(0, self.dtype), None)


class _Presence:
    """Which positions of a segment hold an entry, for good: sorted narrow integers, or a
    bitmap (with the count of set bits before each block) where that is smaller."""

    __slots__ = ("count", "pos", "bits", "rank")

    def __init__(self, pos: np.ndarray | None, bits: np.ndarray | None):
        self.pos, self.bits, self.rank = pos, bits, None
        if bits is None:
            self.count = len(pos)  # type: ignore[arg-type]
        elif len(bits) > _RANK_BYTES:
            per_block = np.bitwise_count(bits.view(np.uint64)).reshape(-1, _RANK_BYTES // 8).sum(axis=1, dtype=np.int64)
            self.rank = np.concatenate([[0], np.cumsum(per_block)])
            self.count = int(self.rank[-1])
        else:
            self.count = int(np.bitwise_count(bits).sum())

    @property
    def nbytes(self) -> int:
        return self.pos.nbytes if self.bits is None else self.bits.nbytes + (0 if self.rank is None else self.rank.nbytes)

    def select(self, i: int, j: int) -> np.ndarray:
        """The positions of entries i to j-1 (int64)."""
        if self.bits is None:
            return self.pos[i:j].astype(np.int64)  # type: ignore[index]
        if self.rank is None:
            return np.flatnonzero(np.unpackbits(self.bits))[i:j]
        rank, out = self.rank, []
        block = int(np.searchsorted(rank, i, side="right")) - 1
        skip, need = i - int(rank[block]), j - i
        while need > 0 and block < len(rank) - 1:
            if rank[block + 1] > rank[block]:
                found = np.flatnonzero(np.unpackbits(self.bits[block * _RANK_BYTES:(block + 1) * _RANK_BYTES]))
                found = found[skip:skip + need] + block * _RANK_BLOCK
                skip, need = 0, need - len(found)
                out.append(found)
            block += 1
        return np.concatenate(out) if out else np.zeros(0, np.int64)


#: the field names of each kind of chunk table (`dataclasses.fields` per call was a fifth of
#: `_take`, and `dataclasses.replace` a third)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _take(table, rows: np.ndarray):
    """A chunk table (ChunkTable, VolumeTable, ...) of some of its rows. (Once per table a
    listing keeps: 28 -> 9 us a call for the 8-row pieces of a listing of 64 files in 8
    shards, made as the dataclass's own `__init__` with every field.)"""
    cls = type(table)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(table))
    m = len(table.coords)
    values = {}
    for name in names:
        value = getattr(table, name)
        if isinstance(value, np.ndarray) and value.shape[:1] == (m,):
            value = value[rows]
        elif isinstance(value, list) and len(value) == m:
            value = [value[i] for i in rows.tolist()]
        values[name] = value
    return cls(**values)


def _joinable(a, b) -> bool:
    """Two tables of the same shard version with one key: their rows can be one table."""
    return (type(a) is type(b) and getattr(a, "keys", None) is None and getattr(b, "keys", None) is None
            and getattr(a, "key", None) == getattr(b, "key", None) and getattr(a, "version", None) is getattr(b, "version", None))


def _join(tables: list) -> list:
    """Consecutive joinable tables made one (the slices of one shard's index)."""
    out: list = []
    run: list = []
    for t in tables + [None]:
        if run and (t is None or not _joinable(run[0], t)):
            if len(run) == 1:
                out.append(run[0])
            else:
                first = run[0]
                m = len(first.coords)
                changes = {f.name: np.concatenate([getattr(x, f.name) for x in run])
                           for f in dataclasses.fields(first)
                           if isinstance(getattr(first, f.name), np.ndarray) and getattr(first, f.name).shape[:1] == (m,)}
                out.append(dataclasses.replace(first, **changes))
            run = []
        if t is not None:
            run.append(t)
    return out


@dataclass(slots=True)
class _Segment:
    """The entries of one segment of a listing (the positions one shard spans along the listed
    axis, or a shard's chunks in a flat listing), in position order: the rows of its chunk
    tables (`tables`, in `order` of their concatenation when they need one), or which
    positions hold an entry (`presence`)."""

    seg: int
    count: int
    tables: list | None = None
    starts: np.ndarray | None = None  # row of each table in the concatenation
    order: np.ndarray | None = None
    presence: _Presence | None = None

    @property
    def nbytes(self) -> int:
        if self.presence is not None:
            return self.presence.nbytes + _OBJECT_COST
        return (sum(t.nbytes + _OBJECT_COST for t in self.tables or ()) + (0 if self.order is None else self.order.nbytes)
                + _OBJECT_COST)


class ChunkRows(HeldRows):
    """The rows of one chunk directory for the kernel, made a window at a time (`window`) from
    compact numpy data per segment (see the module docstring), plus a few rows added by the
    directory itself (`add`: metadata files). What it holds is counted in the tree's
    `RowsBudget` for as long as it lives (the directory handle that listed it)."""

    def __init__(self, space: ChunkSpace, path: tuple[int, ...], nested: bool):
        self.space = space
        self.path = path
        self.nested = nested
        d = len(path)
        self.axis = space.axes[d] if nested else None
        self.files = not nested or d + 1 == space.ndim
        if nested:
            lin = 0
            for c, g in zip(path, space.pgrid):
                lin = lin * g + c
            self.base_ino = space.start + space.depth_start[d + 1] + lin * space.pgrid[d]
        else:
            self.base_ino = space.start + space.depth_start[space.ndim]
        source = space.source
        per = getattr(source, "per_shard", None) or source.grid
        self.per_shard = tuple(max(1, int(p)) for p in per)
        self.shard_grid = tuple(-(-g // p) for g, p in zip(source.grid, self.per_shard))
        self.span = self.per_shard[self.axis] if nested else math.prod(self.per_shard)  # type: ignore[index]
        self.segments: list[_Segment] = []
        self.starts = np.zeros(1, np.int64)
        self.made: Rows | None = None  # a small listing's rows, made at once (instead of segments)
        self.extra = Rows.empty()
        super().__init__(space.tree.rows_budget)

    def where(self) -> str:
        parts = [self.space.where, *([self.space.layout.top] if self.nested and self.space.layout.top else []), *map(str, self.path)]
        return "/".join(p for p in parts if p) or "/"

    # -- positions and grid coordinates

    def place(self, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment, position within it) of chunks by grid coordinates."""
        if self.nested:
            values = coords[:, self.axis]
            return values // self.span, values % self.span
        if not self.space.ndim:
            zero = np.zeros(len(coords), np.int64)
            return zero, zero
        per = np.array(self.per_shard, dtype=np.int64)
        shard = coords // per
        return (np.ravel_multi_index(tuple(shard.T), self.shard_grid).astype(np.int64),
                np.ravel_multi_index(tuple((coords - shard * per).T), self.per_shard).astype(np.int64))

    def unplace(self, seg: int, pos: np.ndarray) -> np.ndarray:
        """Values of the listed axis (nested) or grid coordinates (flat) of positions of a segment."""
        if self.nested:
            return pos + seg * self.span
        if not self.space.ndim:
            return np.zeros((len(pos), 0), np.int64)
        base = np.array(np.unravel_index(seg, self.shard_grid), dtype=np.int64) * np.array(self.per_shard, dtype=np.int64)
        return np.stack(np.unravel_index(pos, self.per_shard), axis=1).astype(np.int64) + base

    def names_inos(self, values: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Names and inode numbers of entries by `unplace` values."""
        if self.nested:
            return [str(v) for v in values.tolist()], values + self.base_ino
        space = self.space
        pcoords = values[:, list(space.axes)]
        lin = np.ravel_multi_index(tuple(pcoords.T), space.pgrid).astype(np.int64) if space.ndim else np.zeros(len(values), np.int64)
        flat_name = space.layout.flat_name
        return [flat_name(tuple(c)) for c in values.tolist()], lin + self.base_ino

    # -- Rows

    def __len__(self) -> int:
        return int(self.starts[-1]) + len(self.extra)

    def add(self, name: str, ino: int, is_dir: bool, size: int | None, stamp: Stamp, token: Hashable) -> None:
        self.extra.add(name, ino, is_dir, size, stamp, token)

    def window(self, start: int, stop: int) -> tuple[list, list, list, list, list, list]:
        total = int(self.starts[-1])
        if self.made is not None:
            out = self.made.window(max(0, start), min(stop, total))
        else:
            out = ([], [], [], [], [], [])
            at = max(0, start)
            k = int(np.searchsorted(self.starts, at, side="right")) - 1
            while at < min(stop, total):
                first = int(self.starts[k])
                i, j = at - first, min(stop, int(self.starts[k + 1])) - first
                if j > i:
                    self._segment_rows(self.segments[k], i, j, out)
                at, k = first + j, k + 1
        if stop > total:
            for column, extra in zip(out, self.extra.window(max(0, start - total), stop - total)):
                column += extra
        return out

    @property
    def names(self) -> list[str]:  # type: ignore[override]
        return self.window(0, len(self))[0]

    @property
    def inos(self) -> list[int]:  # type: ignore[override]
        return self.window(0, len(self))[1]

    @property
    def is_dir(self) -> list[bool]:  # type: ignore[override]
        return self.window(0, len(self))[2]

    @property
    def sizes(self) -> list:  # type: ignore[override]
        return self.window(0, len(self))[3]

    @property
    def stamps(self) -> list:  # type: ignore[override]
        return self.window(0, len(self))[4]

    @property
    def tokens(self) -> list:  # type: ignore[override]
        return self.window(0, len(self))[5]

    def _segment_rows(self, segment: _Segment, i: int, j: int, out: tuple) -> None:
        names, inos, dirs, sizes, stamps, tokens = out
        n = j - i
        if segment.presence is not None:
            values = self.unplace(segment.seg, segment.presence.select(i, j))
            seg_names, seg_inos = self.names_inos(values)
            names += seg_names
            inos += seg_inos.tolist()
            if self.files:
                dirs += [False] * n
                sizes += [None] * n
                stamps += [_UNKNOWN] * n
                tokens += [None] * n
            else:
                dirs += [True] * n
                sizes += [0] * n
                bits, per, path = self.space.bits, self.space.bits.per[self.axis], self.path  # type: ignore[index]
                shown: dict[int, Stamp] = {}
                for v in values.tolist():
                    stamp = shown.get(v // per)
                    if stamp is None:
                        stamp = shown[v // per] = bits.stamp((*path, v))
                    stamps.append(stamp)
                tokens += [None] * n
            return
        space = self.space
        tables = segment.tables
        assert tables is not None
        if segment.order is None and len(tables) == 1:  # one table, in position order
            table = tables[0]
            coords = table.coords[i:j]
            rows_l = list(range(i, j))
            pick = None
        else:
            at = segment.order[i:j].astype(np.int64) if segment.order is not None else np.arange(i, j)
            which = np.searchsorted(segment.starts, at, side="right") - 1  # type: ignore[arg-type]
            rows = at - segment.starts[which]  # type: ignore[index]
            coords = np.empty((n, space.ndim), np.int64)
            for t in distinct(which).tolist():
                sel = which == t
                coords[sel] = tables[t].coords[rows[sel]]
            rows_l, pick = rows.tolist(), which.tolist()

        def table_of(k: int):
            return table if pick is None else tables[pick[k]]  # type: ignore[index]

        seg_names, seg_inos = self.names_inos(coords[:, self.axis] if self.nested else coords)
        names += seg_names
        inos += seg_inos.tolist()
        dirs += [False] * n
        coords_l = coords.tolist()
        if not space.plain:  # the view's files (transcoded, with headers): made for the window's rows
            make = space.make_file
            for k, ino in enumerate(seg_inos.tolist()):
                c = tuple(coords_l[k])
                node = space._made(make(ino, table_of(k).ref(rows_l[k]), c), c)
                sizes.append(node.known_size())
                stamps.append(node.stamp())
                tokens.append(node.token())
            return
        if pick is None:
            sizes += table.lengths[i:j].tolist()
            stamps += [stamp_of(table.version)] * n
            tokens += [table.version] * n
        else:
            shown: dict[int, Stamp] = {}
            for k in range(n):
                t = table_of(k)
                sizes.append(t.lengths.item(rows_l[k]))
                stamp = shown.get(id(t))
                if stamp is None:
                    stamp = shown[id(t)] = stamp_of(t.version)
                stamps.append(stamp)
                tokens.append(t.version)
        # the window's files to the tree's recent listings: opened right after, they need no
        # index lookup (the open still checks the shard's version). Kept as numpy arrays (about
        # 40 bytes a file, against 150 as Python lists: the listings keep 65,536 files)
        order = np.argsort(seg_inos, kind="stable")
        made_coords = coords[order]
        made_rows = np.asarray(rows_l, dtype=np.int64)[order]
        made_tables = [table] if pick is None else tables
        which_t = None if pick is None else np.asarray(pick, dtype=np.int32)[order]
        make = space.make_file

        def listed(ino: int, r: int) -> File:
            c = tuple(made_coords[r].tolist())
            t = made_tables[0] if which_t is None else made_tables[which_t.item(r)]
            return space._made(make(ino, t.ref(made_rows.item(r)), c), c)

        space.tree.listed.add(seg_inos[order], listed)


class _Build:
    """Makes a ChunkRows from the chunk tables a source hands over (`add`), in any order,
    within the rows budget: files keep their table rows while they fit, then only their
    positions; positions are merged or made bitmaps as they grow; ListingTooLarge past that."""

    def __init__(self, rows: ChunkRows, fixed: dict[int, int]):
        self.rows = rows
        self.fixed = fixed
        space = rows.space
        self.leading = space.axes[:len(rows.path)] == tuple(range(len(rows.path)))  # (tables are C-sorted)
        self.tables: dict[int, list] | None = {} if rows.files else None
        self.positions: dict[int, _Positions] = {}
        self.nbytes = 0  # of the tables kept (and the order they will need)
        self.seen = 0  # entries handed over (for the message)
        #: (table, its rows listed or None for all) while the listing may be a small one
        self.small: list[tuple] | None = [] if rows.files and space.plain else None
        self.small_rows = self.small_bytes = 0
        #: segments of a listing of values (not files) whose every position holds an entry:
        #: no more shards of them are read (`wanted`; the fourth outside attacker's `ls c/` of
        #: a 3-D array of 300 x 300 row directories read all 90,000 shards for 600 names: 149 s)
        self.full: set[int] = set()
        self.extent = None if rows.files else space.source.grid[rows.axis]

    def add(self, table, matched: bool = False) -> None:
        """A table of chunks: C-sorted, or `matched` (every row has the fixed coordinates)."""
        m = len(table.coords)
        if not m:
            return
        rows = None
        if self.fixed and not matched:
            rows = leading_rows(table.coords, self.rows.path) if self.leading else matching_rows(table.coords, self.fixed)
            if not len(rows):
                return
            if len(rows) == m:
                rows = None
        if self.small is None:
            self._add(table, rows)
            return
        nbytes = table.nbytes
        self.small.append((table, rows, nbytes))
        self.small_rows += m if rows is None else len(rows)
        self.small_bytes += nbytes
        if self.small_rows > SMALL_LISTING or self.small_bytes > _SMALL_BYTES:
            self._not_small()

    def _not_small(self) -> None:
        """The tables held for a small listing, made the general way."""
        small, self.small = self.small, None
        for table, rows, _ in small or ():
            self._add(table, rows)

    def _add(self, table, rows: np.ndarray | None) -> None:
        """A table's rows (None: all of them) into the listing's segments."""
        coords = table.coords
        if rows is not None:
            coords = coords[rows]
            if self.tables is not None:
                table = _take(table, rows)
        self.seen += len(coords)
        seg, pos = self.rows.place(coords)
        if len(seg) and seg[0] == seg[-1] and (seg == seg[0]).all():
            groups = [(int(seg[0]), None)]
        else:
            order = np.argsort(seg, kind="stable")
            seg, pos, coords = seg[order], pos[order], None
            if self.tables is not None:
                table = _take(table, order)
            cuts = np.flatnonzero(seg[1:] != seg[:-1]) + 1
            bounds = [0, *cuts.tolist(), len(seg)]
            groups = [(int(seg[a]), slice(a, b)) for a, b in zip(bounds, bounds[1:])]
        for s, part in groups:
            if self.tables is not None:
                piece = table if part is None else _take(table, np.arange(part.start, part.stop))
                kept = self.tables.get(s)
                if kept is None:
                    kept = self.tables[s] = []
                    self.nbytes += _OBJECT_COST
                kept.append(piece)
                self.nbytes += piece.nbytes + 8 * len(piece.coords) + _OBJECT_COST
            else:
                self._add_positions(s, pos if part is None else pos[part])
        self.check()

    def _add_positions(self, seg: int, pos: np.ndarray) -> None:
        acc = self.positions.get(seg)
        if acc is None:
            acc = self.positions[seg] = _Positions(self.rows.span)
            self.nbytes += _OBJECT_COST
        before = acc.nbytes
        acc.add(pos if self.rows.files else distinct(pos))
        self.nbytes += acc.nbytes - before
        if self.extent is not None and acc.holds_all(min(self.rows.span, self.extent - seg * self.rows.span)):
            self.full.add(seg)

    def wanted(self, shard: tuple[int, ...]) -> bool:
        """Whether a shard, or a directory of shards by its leading coordinates, can add an
        entry: not if its span along the listed axis is a full segment."""
        axis = self.rows.axis
        return not self.full or axis is None or len(shard) <= axis or shard[axis] not in self.full

    def check(self) -> None:
        if self.rows.hold(self.nbytes):
            return
        if self.tables is not None:  # too many files to keep their rows: positions only
            tables, self.tables = self.tables, None
            self.nbytes = 0
            for s, kept in tables.items():
                for table in kept:
                    self._add_positions(s, self.rows.place(table.coords)[1])
            if self.rows.hold(self.nbytes):
                return
        self.nbytes = 0
        for acc in self.positions.values():
            acc.merge()
            self.nbytes += acc.nbytes + _OBJECT_COST
        if self.rows.hold(self.nbytes):
            return
        budget = self.rows.budget
        raise ListingTooLarge(
            f"{self.rows.where()}: listing this directory ({self.seen} entries so far) would take more than the "
            f"{budget.max_bytes >> 10} KiB that the listings of open chunk directories may hold "
            f"({(budget.used - self.rows.held) >> 10} KiB held by others); raise -o memory= (or index_cache=)")

    def finish(self) -> None:
        if self.small is not None:
            if self._finish_small():
                return
            self._not_small()
        rows = self.rows
        segments = []
        if self.tables is not None:
            for s in sorted(self.tables):
                tables = _join(self.tables.pop(s))
                if len(tables) == 1:  # (the common case, without the general case's numpy calls on tiny arrays)
                    m = len(tables[0].coords)
                    starts = np.array([0, m], np.int64)
                    pos = rows.place(tables[0].coords)[1] if m > 1 else None
                else:
                    starts = np.cumsum([0, *(len(t.coords) for t in tables)])
                    pos = np.concatenate([rows.place(t.coords)[1] for t in tables])
                    m = len(pos)
                order = None
                if len(tables) > 1 or pos is not None and not bool((pos[1:] > pos[:-1]).all()):
                    order = np.argsort(pos, kind="stable").astype(_narrow(m))
                segments.append(_Segment(s, m, tables, starts, order))
        else:
            for s in sorted(self.positions):
                presence = self.positions.pop(s).presence()
                if presence.count:
                    segments.append(_Segment(s, presence.count, presence=presence))
        rows.segments = segments
        rows.starts = np.cumsum([0, *(seg.count for seg in segments)]).astype(np.int64)
        rows.hold(sum(seg.nbytes for seg in segments) + rows.starts.nbytes, force=True)

    def _finish_small(self) -> bool:
        """A small listing of plain files made in one pass over all its tables (the files'
        order, names, sizes and stamps, with numpy calls on the whole listing, not per shard),
        and its files handed to the tree's recent listings; False if its rows do not fit the
        rows budget (made the general way then, which may keep less)."""
        rows, small = self.rows, self.small
        assert small is not None
        n = self.small_rows
        if not n:
            rows.made = Rows.empty()
            return True
        picks, tables, nbytes = [], [], n * _SMALL_ROW_COST
        for table, pick, size in small:  # a whole table kept only if not much larger than its part here
            m = len(table.coords)
            if pick is None:
                pick = np.arange(m)
            elif len(pick) * _KEEP_FACTOR < m:
                table, pick = _take(table, pick), np.arange(len(pick))
                size = table.nbytes
            picks.append(pick)
            tables.append(table)
            nbytes += size + _OBJECT_COST
        if not rows.hold(nbytes):
            return False
        self.small = None
        if len(tables) == 1:
            coords, which, idx, lengths = tables[0].coords[picks[0]], None, picks[0], tables[0].lengths[picks[0]]
        else:
            coords = np.concatenate([t.coords[p] for t, p in zip(tables, picks)])
            which = np.repeat(np.arange(len(tables)), [len(p) for p in picks])
            idx = np.concatenate(picks)
            lengths = np.concatenate([t.lengths[p] for t, p in zip(tables, picks)])
        seg, pos = rows.place(coords)
        order = np.lexsort((pos, seg))
        coords, idx, lengths = coords[order], idx[order], lengths[order]
        names, inos = rows.names_inos(coords[:, rows.axis] if rows.nested else coords)
        if which is None:
            which_l = None
            stamps, tokens = [stamp_of(tables[0].version)] * n, [tables[0].version] * n
        else:
            which_l = which[order].tolist()
            shown = [stamp_of(t.version) for t in tables]
            stamps, tokens = [shown[w] for w in which_l], [tables[w].version for w in which_l]
        rows.made = Rows(names, inos.tolist(), [False] * n, lengths.tolist(), stamps, tokens)
        rows.starts = np.array([0, n], np.int64)
        # the files to the tree's recent listings, by inode number: opened right after, they
        # need no index lookup (the open still checks the shard's version)
        by_ino = None if n < 2 or bool((inos[1:] > inos[:-1]).all()) else np.argsort(inos, kind="stable")
        by_ino_l = None if by_ino is None else by_ino.tolist()
        coords_l, idx_l = coords.tolist(), idx.tolist()
        space = rows.space
        make, made = space.make_file, space._made

        def listed(ino: int, r: int) -> File:
            k = r if by_ino_l is None else by_ino_l[r]
            c = tuple(coords_l[k])
            return made(make(ino, tables[0 if which_l is None else which_l[k]].ref(idx_l[k]), c), c)

        space.tree.listed.add(inos if by_ino is None else inos[by_ino], listed)
        return True
