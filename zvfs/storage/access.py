"""Who can reach a file of a local store: its read bits folded over the directories above it.

A mount shows every node with one owner, group and mode, and with `allow_other` the kernel
(`default_permissions`) grants access from those alone. A reader of the store itself must also
search every directory on the way to a file (the store root's ancestors, the root, a group, an
array, its `c/`, a shard's row directories), and many of those have no node in a view (N5 and
Zarr v2 never show `c/`; no view shows a shard's directories). So the bits a node shows are its
own, less every class of reader that some directory on its path stops (`reach`): a directory
closed to others (0700) closes everything below it to others, in every view.

The fold is exact when the path's directories have the file's owner and group (the common
case), and otherwise never wider than the store: a reader of a class is let through only if
every user that class can hold passes each directory (a group member may own a directory, a
reader who is neither owner nor group member may still be in a directory's group).
"""

from __future__ import annotations

import os
import pwd
from functools import lru_cache

#: one directory on a path: (owner, group, permission bits)
Dir = tuple[int, int, int]
USER, GROUP, OTHER = 0o700, 0o070, 0o007


@lru_cache(maxsize=1024)
def groups_of(uid: int) -> frozenset[int] | None:
    """Every group `uid` is in (primary and supplementary), None for a user unknown here."""
    try:
        pw = pwd.getpwuid(uid)
        return frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, OSError):
        return None


def reach(path: list[Dir] | tuple[Dir, ...], uid: int, gid: int) -> int:
    """The permission classes of a file owned by `uid`:`gid` whose readers get through every
    directory of `path` (0o777 less the classes stopped somewhere), to be ANDed with the file's
    own bits. Root (uid 0) passes every directory."""
    u = g = o = True
    member_of = groups_of(uid) if uid else None
    for d_uid, d_gid, d_mode in path:
        ux, gx, ox = bool(d_mode & 0o100), bool(d_mode & 0o010), bool(d_mode & 0o001)
        if uid:  # the file's owner: exactly one class of the directory applies
            if d_uid == uid:
                u &= ux
            elif member_of is None:  # groups unknown: either of the other two
                u &= gx and ox
            else:
                u &= gx if d_gid in member_of else ox
        owner_ok = d_uid == uid or ux  # any other reader may own the directory
        g &= owner_ok and gx and (d_gid == gid or ox)  # members of the file's group
        o &= owner_ok and ox and (d_gid == gid or gx)  # everyone else (never in the file's group)
    return (USER if u else 0) | (GROUP if g else 0) | (OTHER if o else 0)

