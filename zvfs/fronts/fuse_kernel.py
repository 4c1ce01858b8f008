"""What the kernel may hold of each inode (its attributes and page cache), and which inode
number the kernel is given for each version of a file: the FUSE front's half of the contract
(docs/reliability.md).

One inode, one version at a time. The kernel keeps one page cache per inode, shared by every
open file, every mmap (private ones included) and every read-ahead (`posix_fadvise`,
`readahead(2)`) of it, whatever handle asked. So two versions of a file are never shown
through one inode number at once:

* An inode's numbers come from the tree (`Node.ino`) while at most one version of it is read.
  While open handles read one version of an inode, a lookup or listing that finds another
  version gives the kernel an *alias*: a number of its own for that (node, version), from the
  top of the number space. Its pages are that version's alone.
* An open that finds another version than the inode's open handles read is refused with
  ESTALE: the kernel then looks the name up again (the VFS retries an open once with
  LOOKUP_REVAL), which gives it the alias, and opens that. (Before, the second open bypassed
  the page cache with direct I/O; a private mmap or a read-ahead of it still filled the shared
  page cache with the new version, which the old handles then read.)
* An alias is an inode like any other: while handles read it, an open of another version is
  ESTALE; with none open, an open of another version moves it to that version (the kernel's
  pages and attributes of it dropped, as below).

Within one inode, versions follow each other (no handle open, then a new version): every
answer that gives the kernel an inode's attributes (lookup, getattr, a listing entry) or pages
(a push) records the *token* of what it described (`File.token`: a shard's version for chunk
files, a file's own version for files shown as stored), and an open compares its handle's
token: the same, `keep_cache`; another, or one this table has let go of: no `keep_cache` (the
kernel drops its pages as the open completes) and the attributes are invalidated before the
open returns. While handles read an inode, `getattr` gives the size of their version
(`size_for`): the kernel clamps page-cache reads to the size it holds.

The table is bounded (`kept` entries, oldest first out). An inode that leaves it and may have
pages in the kernel (it was opened, or pushed) is marked `dropping` and handed to `drop` (the
FUSE front invalidates its pages and attributes in a worker thread); until that is done its
opens drop everything, and afterwards the kernel holds nothing of it that an open could trust.
An inode the kernel only got attributes of (listed, looked up) leaves without that: its next
open, finding nothing here, invalidates its attributes (a listing of 200,000 files with a
table of 4,096 would otherwise cost 196,000 invalidations). Aliases are bounded too (`kept`);
the kernel's requests for one let go of are ESTALE, and the VFS looks the name up again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, NamedTuple

STALE = ("stale",)  # the kernel may hold something of another version than any token here
_ABSENT = object()
#: alias numbers count down from here (the tree counts up from 1; the control files sit above)
ALIAS_TOP = 2**63 - 16


class Alias(NamedTuple):
    """An inode number given to the kernel for one version of a tree node."""

    ino: int  # the tree node's own number
    token: Hashable
    size: int | None


class KernelCache:
    def __init__(self, kept: int, drop: Callable[[list[int]], None]):
        self.kept = kept
        self._drop = drop
        self.told: dict[int, Hashable] = {}  # inode -> token of what the kernel was told or handed
        #: inode -> [token, size, count] of the open handles (one version at a time)
        self.cached: dict[int, list] = {}
        self.paged: set[int] = set()  # inodes the kernel may hold pages of (opened or pushed), in `told`
        self.dropping: set[int] = set()  # let go of with pages: invalidation under way
        self.aliases: OrderedDict[int, Alias] = OrderedDict()  # alias number -> what it shows
        self._alias_of: dict[tuple[int, Hashable], int] = {}
        self._next_alias = ALIAS_TOP

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

    # -- which number the kernel gets

    def number(self, ino: int, token: Hashable, size: int | None) -> int:
        """The inode number to give the kernel for tree node `ino` showing `token` (`size`
        bytes): `ino` itself, unless open handles read another version through it (an alias
        for this version, the same one every time)."""
        held = self.cached.get(ino)
        if held is None or token is None or held[0] == token:
            return ino
        key = (ino, token)
        alias = self._alias_of.get(key)
        if alias is None:
            alias = self._next_alias
            self._next_alias -= 1
            self._alias_of[key] = alias
            self.aliases[alias] = Alias(ino, token, size)
            if len(self.aliases) > self.kept:
                self._forget_aliases()
        else:
            self.aliases.move_to_end(alias)
        return alias

    def _forget_aliases(self) -> None:
        for alias in list(self.aliases)[: max(1, len(self.aliases) // 16)]:
            if alias in self.cached:  # (open: kept)
                self.aliases.move_to_end(alias)
                continue
            entry = self.aliases.pop(alias)
            self._alias_of.pop((entry.ino, entry.token), None)
            self.told.pop(alias, None)
            if alias in self.paged:
                self.paged.discard(alias)
                self.dropping.add(alias)
                self._drop([alias])

    def retarget(self, alias: int, token: Hashable, size: int | None) -> None:
        """An alias with no open handle now shows another version (an open found one: from
        here on it is like a tree number whose version changed)."""
        entry = self.aliases.get(alias)
        if entry is None or entry.token == token:
            return
        if self._alias_of.get((entry.ino, entry.token)) == alias:
            del self._alias_of[(entry.ino, entry.token)]
        self._alias_of.setdefault((entry.ino, token), alias)
        self.aliases[alias] = Alias(entry.ino, token, size)

    def alias(self, ino: int) -> Alias | None:
        """What alias `ino` shows (None: not an alias, or one let go of: `is_alias`)."""
        return self.aliases.get(ino)

    def is_alias(self, ino: int) -> bool:
        return self._next_alias < ino <= ALIAS_TOP

    # -- what the kernel was told, what it opens

    def told_about(self, ino: int, token: Hashable) -> None:
        """The kernel was given the attributes of `ino` as `token` describes them."""
        old = self.told.get(ino, _ABSENT)
        if old is _ABSENT:
            self._set(ino, STALE if token is None or ino in self.dropping else token)
        elif old != token:  # attributes of one version, maybe pages of another
            self.told[ino] = STALE

    def opening(self, ino: int, token: Hashable, size: int | None) -> tuple[bool, bool] | None:
        """(keep_cache, invalidate the attributes first) for an open of `ino` whose handle
        holds `token` (`size` bytes), the handle counted as open (`closed`); None when open
        handles of `ino` read another version (the open is refused: ESTALE)."""
        held = self.cached.get(ino)
        if held is not None:
            if token is not None and held[0] == token:
                held[2] += 1
                return True, False
            return None
        told = self.told.get(ino, _ABSENT)
        keep = token is not None and (told is token or told == token) and ino not in self.dropping
        if not keep:
            self._set(ino, STALE if token is None else token)
        self.paged.add(ino)
        self.cached[ino] = [token, size, 1]
        return keep, not keep

    def closed(self, ino: int) -> None:
        held = self.cached.get(ino)
        if held is not None:
            held[2] -= 1
            if not held[2]:
                del self.cached[ino]

    def size_for(self, ino: int, token: Hashable) -> int | None:
        """The size to tell the kernel for `ino`, whose node now says `token`, when handles read
        another version of it (that version's size); else None."""
        held = self.cached.get(ino)
        return None if held is None or held[0] == token else held[1]

    def pushing(self, ino: int, token: Hashable) -> bool:
        """Whether the bytes `token` names may be put in the kernel's cache for `ino` now (no
        open handle, which could hold the pages locked, and nothing of another version known
        to be there); if so they are recorded as there."""
        if token is None or ino in self.cached or ino in self.dropping:
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
