"""What the kernel may hold of each inode (its attributes and page cache), so that an open
can tell it what to drop: the FUSE front's half of the contract (docs/reliability.md).

The kernel keeps attributes and pages for 24 h (`keep_cache`): the FUSE front answers every
open with `keep_cache` only when the pages the kernel may hold are of the version the open
sees. So every answer that gives the kernel an inode's attributes (lookup, getattr, a listing
entry) or pages (a push) records the *token* of what it described (`File.token`: a shard's
version for chunk files, a file's own version for files shown as stored), and an open compares
its handle's token:

* the same: `keep_cache` (re-reads come from the kernel's pages);
* another, or one this table has let go of: no `keep_cache` (the kernel drops its pages as
  the open completes) and the attributes are invalidated before the open returns (a changed
  size is asked for again); the new token is recorded;
* another open handle of the inode reads a different version through the page cache: the
  new handle gets `direct_io`, so neither sees the other's pages.

The kernel also keeps one size per inode, and clamps page-cache reads to it: while handles
read an inode through the page cache, every answer that gives the kernel its attributes
gives the size of the version they hold (`size_for`), whatever a lookup or listing found
since (a handle would otherwise see its version cut short, or a listing made before a change
and sent after it would undo the open's invalidation).

The table is bounded (`kept` entries, oldest first out). An inode that leaves it and may have
pages in the kernel (it was opened, or pushed) is marked `dropping` and handed to `drop` (the
FUSE front invalidates its pages and attributes in a worker thread); until that is done its
opens drop everything, and afterwards the kernel holds nothing of it that an open could trust.
An inode the kernel only got attributes of (listed, looked up) leaves without that: its next
open, finding nothing here, invalidates its attributes (a listing of 200,000 files with a
table of 4,096 would otherwise cost 196,000 invalidations).
"""

from __future__ import annotations

from typing import Callable, Hashable

STALE = ("stale",)  # the kernel may hold something of another version than any token here
_ABSENT = object()


class KernelCache:
    def __init__(self, kept: int, drop: Callable[[list[int]], None]):
        self.kept = kept
        self._drop = drop
        self.told: dict[int, Hashable] = {}  # inode -> token of what the kernel was told or handed
        #: inode -> [token, size, count] of the handles that read it through the page cache
        #: (one version at a time), and the count of those that bypass it (another version)
        self.cached: dict[int, list] = {}
        self.direct: dict[int, int] = {}
        self.paged: set[int] = set()  # inodes the kernel may hold pages of (opened or pushed), in `told`
        self.dropping: set[int] = set()  # let go of with pages: invalidation under way

    def _set(self, ino: int, token: Hashable) -> None:
        self.told.pop(ino, None)
        self.told[ino] = token
        if len(self.told) > self.kept:
            self._evict()

    def _evict(self) -> None:
        out = []
        for ino in list(self.told)[: max(1, len(self.told) // 16)]:
            if ino in self.cached:  # what open handles read stays known
                self.told[ino] = self.told.pop(ino)
                continue
            del self.told[ino]
            if ino in self.paged:
                self.paged.discard(ino)
                self.dropping.add(ino)
                out.append(ino)
        if out:
            self._drop(out)

    def dropped(self, inos: list[int]) -> None:
        """The kernel holds nothing of these any more."""
        self.dropping.difference_update(inos)

    def told_about(self, ino: int, token: Hashable) -> None:
        """The kernel was given the attributes of `ino` as `token` describes them."""
        old = self.told.get(ino, _ABSENT)
        if old is _ABSENT:
            self._set(ino, STALE if token is None or ino in self.dropping else token)
        elif old != token:  # attributes of one version, maybe pages of another
            self.told[ino] = STALE

    def opening(self, ino: int, token: Hashable, size: int | None) -> tuple[bool, bool, bool]:
        """(keep_cache, direct_io, invalidate the attributes first) for an open of `ino` whose
        handle holds `token` (`size` bytes); the handle is counted as open (`closed` with the
        same direct_io)."""
        held = self.cached.get(ino)
        if held is not None:
            if token is not None and held[0] == token:
                held[2] += 1
                return True, False, False
            self.direct[ino] = self.direct.get(ino, 0) + 1
            return True, True, False  # another version is read through the page cache: bypass it
        told = self.told.get(ino, _ABSENT)
        keep = token is not None and (told is token or told == token) and ino not in self.dropping
        if not keep:
            self._set(ino, STALE if token is None else token)
        self.paged.add(ino)
        self.cached[ino] = [token, size, 1]
        return keep, False, not keep

    def closed(self, ino: int, direct: bool) -> None:
        if direct:
            n = self.direct.pop(ino, 1) - 1
            if n:
                self.direct[ino] = n
            return
        held = self.cached.get(ino)
        if held is not None:
            held[2] -= 1
            if not held[2]:
                del self.cached[ino]

    def size_for(self, ino: int, token: Hashable) -> int | None:
        """The size to tell the kernel for `ino`, whose node now says `token`, when handles read
        another version of it through the page cache (that version's size); else None."""
        held = self.cached.get(ino)
        return None if held is None or held[0] == token else held[1]

    def pushing(self, ino: int, token: Hashable) -> bool:
        """Whether the bytes `token` names may be put in the kernel's cache for `ino` now (no
        open handle, which could hold the pages locked, and nothing of another version known
        to be there); if so they are recorded as there."""
        if token is None or ino in self.cached or ino in self.direct or ino in self.dropping:
            return False
        told = self.told.get(ino, _ABSENT)
        if told is not _ABSENT and told != token:
            return False
        self._set(ino, token)
        self.paged.add(ino)
        return True

    def clear(self) -> None:
        """`zvfs refresh`: nothing the kernel holds is trusted any more (what open handles read
        stays as it is)."""
        for ino in self.told:
            if ino not in self.cached:
                self.told[ino] = STALE
