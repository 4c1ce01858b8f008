"""The bits of a view's chunk directories: those of the store directories their entries come from.

A reader of the store lists a shard-row directory (`c/0/`) only with its read bit and looks a
shard up in it only with its search bit; a view's chunk directory must let no one list or
look up more. So each directory of a view stands for the store directories its entries come
from (`span`), found from the chunk grid alone:

- axes in the store's order (the Zarr v3 and v2 views of a `/`-keyed array): one directory, at
  the same depth: `c/i0/../ik` of the view is `c/(i0//s0)/../(ik//sk)` of the store (s: chunks
  per shard along each axis); a directory of chunk files is its shards' directory. The store's
  bits, exactly.
- axes reversed (the N5 view): a directory naming values of array axis `a` spans every store
  directory at depth `a` (the ones naming shard coordinate `a`) that its path does not fix, a
  directory of files every directory of the shards its path fixes; their bits folded
  (`access.fold`): nobody lists such a directory who cannot list all of them (narrower than
  the store where they differ: a closed row closes its open neighbours' chunks in this view).
- keys not nested (a `.` separator: every key in one directory), stores of other kinds, and
  stores whose directories have no bits (remote): the bits of `c/` or of the array directory,
  as before (`base`).

The bits come from what a local store keeps anyway to fold its files' bits (`Store.known_dir`:
its walks and directory facts, looked at every second under allow_other, so a row directory
narrowed while mounted is followed as any other); a span not known yet is walked when its
directory is made or shown (`learn`: on the loop from the kernel's caches, else a worker
thread, once per directory), and the fold is kept per span until the store learns or forgets
a directory (`Store.generation`). A span of more than SPAN_MAX directories (an N5 directory of
an array of 100 x 100 shard rows spans 10,000) is learned from one scan of each of their
parents (`Store.learn_subdirs`: a stat of each entry, the distinct bits kept per parent and
watched as walked directories are), for up to SPAN_MAX parents; past that it is shown closed to
all but root. Nothing per chunk file: lookups and opens of files cost nothing more.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable

import trio

from ..storage.access import fold
from ..storage.base import Store
from ..tree.nodes import Stamp

log = logging.getLogger("zvfs.view")

#: store directories one view directory may stand for, walked one by one; past it, their
#: parents, scanned (past both the directory is shown closed to all but root). A span is walked
#: once (then kept): 4096 row directories took 77-132 ms from the kernel's caches on the loop
#: (19-32 us each; `known_dir` of one known: 1.2-1.6 us)
SPAN_MAX = 4096
YIELD_EVERY = 256  # directories walked between checkpoints (other requests go on meanwhile)
KEPT = 4096  # folds kept per array

Key = tuple[int, tuple[int | None, ...]]


class ChunkBits:
    """The stamps of one array's chunk directories (`stamp`, `learn`), by their path in the
    view (`axes[i]`: the array axis path level i names)."""

    def __init__(self, source, store: Store | None, axes: tuple[int, ...], base: Callable[[], Stamp], where: str):
        self.row_dir = getattr(source, "row_dir", None)
        self.store = store
        self.axes = axes
        self.ndim = source.ndim
        self.base = base
        self.where = where
        per = getattr(source, "per_shard", None) or (1,) * self.ndim
        self.per = tuple(max(1, int(p)) for p in per)
        self.shard_grid = tuple(-(-g // p) for g, p in zip(source.grid, self.per))
        self.nested = (store is not None and store.dir_bits and self.row_dir is not None and self.ndim > 0
                       and self.row_dir(()) is not None)
        self._kept: dict[Key, tuple[int, Stamp]] = {}
        self._absent: dict[Key, frozenset[str]] = {}  # span members found absent when learned

    def key(self, path: tuple[int, ...]) -> Key:
        """What decides a directory's span: the depth of the store directories it stands for,
        and the shard coordinates its path fixes above that depth."""
        d = len(path)
        depth = self.ndim - 1 if d >= self.ndim - 1 else self.axes[d]
        fixed = {self.axes[i]: c // self.per[self.axes[i]] for i, c in enumerate(path)}
        return depth, tuple(fixed.get(a) for a in range(depth))

    def members(self, key: Key) -> tuple[list[str], range | None] | None:
        """The store directories of a span: (the directories, None) of up to SPAN_MAX; past
        that, (their parents, the numbers that name them in each) for up to SPAN_MAX parents
        (`Store.known_subdirs`); None past both."""
        _, fixed = key
        ranges = [range(self.shard_grid[a]) if c is None else range(c, c + 1) for a, c in enumerate(fixed)]
        count = 1
        for r in ranges:
            count *= len(r)
        if count <= SPAN_MAX:
            return [self.row_dir(prefix) for prefix in itertools.product(*ranges)], None  # type: ignore[misc]
        if count // len(ranges[-1]) > SPAN_MAX:
            return None
        return [self.row_dir(prefix) for prefix in itertools.product(*ranges[:-1])], ranges[-1]  # type: ignore[misc]

    def stamp(self, path: tuple[int, ...]) -> Stamp:
        """The stamp of the directory at `path` (no I/O): its span folded; closed to all but
        root while the span is not known (`learn` makes it known)."""
        base = self.base()
        if not self.nested:
            return base
        key = self.key(path)
        kept = self._kept.get(key)
        if kept is not None and kept[0] == self.store.generation:  # type: ignore[union-attr]
            return kept[1]
        found = self._fold(key, base)
        return found if found is not None else Stamp(0, base.mtime_ns, base.uid, base.gid)

    async def learn(self, path: tuple[int, ...]) -> None:
        """Make the span of the directory at `path` known (walks of its store directories not
        known yet)."""
        if not self.nested:
            return
        key = self.key(path)
        kept = self._kept.get(key)
        store = self.store
        assert store is not None
        if kept is not None and kept[0] == store.generation or self._fold(key, self.base()) is not None:
            return
        span = self.members(key)
        if span is None:
            return
        members, names = span
        absent = set()
        with trio.move_on_after(store.patience) as waited:  # (a hung mount below: shown closed, never a hang)
            for i, m in enumerate(members):
                if names is None:
                    if store.known_dir(m) is None and await store.learn_dir(m) is None:
                        absent.add(m)
                elif store.known_subdirs(m, names) is None and await store.learn_subdirs(m, names) is None:
                    absent.add(m)
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await trio.lowlevel.checkpoint()
        if waited.cancelled_caught:
            log.warning("%s: the bits of a chunk directory's store directories not read within %g s; shown closed",
                        self.where or "/", store.patience)
            return
        if len(self._absent) >= KEPT:
            self._absent.clear()
        self._absent[key] = frozenset(absent)
        self._fold(key, self.base())

    def _fold(self, key: Key, base: Stamp) -> Stamp | None:
        """The span's stamp from what the store knows (kept), None if a member is not known."""
        span = self.members(key)
        store = self.store
        assert store is not None
        if span is None:
            if key not in self._absent:
                self._absent[key] = frozenset()
                log.warning("%s: a chunk directory stands for the row directories of more than %d store directories; "
                            "shown closed", self.where or "/", SPAN_MAX)
            found = Stamp(0, base.mtime_ns, base.uid, base.gid)
        else:
            members, names = span
            absent = self._absent.get(key, frozenset())
            facts = []
            for m in members:
                f = store.known_dir(m) if names is None else store.known_subdirs(m, names)
                if f is None:
                    if m not in absent:
                        return None
                    continue
                if names is None:
                    facts.append(f)
                else:
                    facts.extend(f)  # type: ignore[arg-type]
            if not facts:  # (no store directory: nothing listed from it)
                found = base
            else:
                owners = {(u, g) for u, g, _ in facts}
                uid, gid = owners.pop() if len(owners) == 1 else (facts[0][0], facts[0][1]) if base.uid is None else (base.uid, base.gid)
                found = Stamp(fold(facts, uid, gid), base.mtime_ns, uid, gid)  # type: ignore[arg-type]
        if len(self._kept) >= KEPT:
            self._kept.clear()
        self._kept[key] = (store.generation, found)
        return found

    def narrow_top(self, own: Stamp) -> Stamp:
        """The array directory's stamp where it holds the first level of chunk names (Zarr v2
        and N5: no `c/`): read bits narrowed by its span's (it lists their names); search
        bits too where those are chunk files (1-d: a lookup of a name finds a chunk's size),
        not where they are directories (answered from the grid alone)."""
        if not self.nested or own.mode is None or own.uid is None:
            return own
        span = self.stamp(())
        both = fold([(own.uid, own.gid, own.mode), (span.uid, span.gid, span.mode)], own.uid, own.gid)  # type: ignore[list-item]
        return own._replace(mode=both if self.ndim == 1 else (both & 0o444) | (own.mode & 0o111))
