"""What every front shows of a node besides its bytes: permission bits, owner, times.

Nothing is shown wider than the store (docs/reliability.md, Permissions): a node's bits are its
own read (and search) bits as a reader of the store has them (`Stamp.mode`, folded over the
directories above it: storage/access.py), never a write bit, never exec on files; a node with
no bits of its own (rewritten metadata, chunk directories of remote stores) gets the store
root's. An administrator's `umask=` replaces all that with 0555/0444 less its bits.
"""

from __future__ import annotations

import os
import time

from ..tree.nodes import Stamp

ALL_READ = 0o444
ALL_SEARCH = 0o111


class Shown:
    """Bits, owner and times as a mount (or `zvfs serve`) shows them. `root`: the store root's
    stamp (a local store's bits as a reader sees them, and its owner); `uid`, `gid`: shown for
    every node when given; `umask`: see the module docstring."""

    __slots__ = ("uid", "gid", "default_uid", "default_gid", "mask", "umask", "stamp_ns")

    def __init__(self, root: Stamp | None = None, uid: int | None = None, gid: int | None = None,
                 umask: int | None = None):
        self.uid, self.gid, self.umask = uid, gid, umask
        self.follow(root or Stamp())
        self.stamp_ns = time.time_ns()  # the time of nodes that have none of their own

    def follow(self, root: Stamp) -> None:
        """The store root's owner and bits, as they are now (again after they changed)."""
        #: otherwise each node's own owner (the store's, where it says), else the store root's
        #: (local stores), else the daemon's
        self.default_uid = os.getuid() if root.uid is None else root.uid
        self.default_gid = os.getgid() if root.gid is None else root.gid
        self.mask = 0o555 if root.mode is None else root.mode & 0o555

    def mode(self, is_dir: bool, mode: int | None) -> int:
        """Permission bits shown (no file type bits)."""
        top = 0o555 if is_dir else 0o444
        if self.umask is not None:
            return top & ~self.umask
        return top & (self.mask if mode is None else mode)

    def owner(self, stamp: Stamp) -> tuple[int, int]:
        uid = self.uid if self.uid is not None else self.default_uid if stamp.uid is None else stamp.uid
        gid = self.gid if self.gid is not None else self.default_gid if stamp.gid is None else stamp.gid
        return uid, gid

    def mtime_ns(self, stamp: Stamp) -> int:
        return self.stamp_ns if stamp.mtime_ns is None else stamp.mtime_ns

    def public(self, is_dir: bool, mode: int | None) -> bool:
        """Whether every local user may read the node (a directory: list it and pass through
        it): what a front with anonymous readers (`zvfs serve`) serves. Every class must have
        the bits, the owner's too: a directory owned by `nobody` at 0055 is closed to `nobody`
        alone, and an anonymous reader may be anyone."""
        bits = self.mode(is_dir, mode)
        return bits & ALL_READ == ALL_READ and (not is_dir or bits & ALL_SEARCH == ALL_SEARCH)
