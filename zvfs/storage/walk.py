"""The directories a reader passes on the way to a path of a local store, symlinks followed.

To open `root/linkarr/c/1/1` where `linkarr -> private/arr`, the kernel looks names up in the
root (`linkarr`), in the root again (`private`, the link's first component), in `private`
(`arr`), in `arr` (`c`), and so on: a reader needs search permission on every directory in
which a name is looked up (fs/namei.c, link_path_walk: `may_lookup` before every component,
`.` and `..` included), on the link's own path as on its target's, through links to links.
The real path of the file alone is not enough (`a -> d1/l`, `d1/l -> ../d2/f`: `d1` is searched
but is on neither the link's path nor the file's), nor is the link's path alone (the attack
this module answers: a 0700 `private/` was never folded in, and a reader read through the
mount what the store refused them).

`resolve` replays that walk in user space with `lstat` and `readlink`, and says which real
directories were searched (the *gates*; plus, with `fs.protected_symlinks`, a gate for a link
only its owner may follow: access.link_gate). Blocking: worker threads only (or the store's
opening). A walk costs one lstat per component and one readlink per link; the local store
keeps what it learns per store directory, so opens pay nothing for it.

Not replayed: mounts over a directory (the real path names what is mounted there, which is
what the kernel searches too), bind mounts and chroots of the reader, `..` above a bind mount
(taken lexically), idmapped mounts, LSMs.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from .access import Dir, acl_of, dir_facts, link_gate, narrowed, needs_acl

MAXSYMLINKS = 40  # as the kernel: a walk that follows more links fails (ELOOP)

#: one gate on the way: a real directory path (searched there), or a Dir (a link's gate)
Gate = str | Dir


@dataclass(slots=True)
class Walked:
    """What a walk found. `real`: the real path reached (None: not reachable: missing, a
    loop, a non-directory in the middle); `gates`: where it was searched, in order, each once;
    `st`: the lstat of what `real` names; `prefixes`: for each leading run of the walked
    components that ended in a directory, (its lexical key, its real path, its gates), so one
    walk teaches every store directory above the key; `facts`: the Dir of every real directory
    among the gates (and of `real` when it is a directory); `own`: the permission bits of what
    `real` names, narrowed by its ACL (access.narrowed)."""

    real: str | None
    gates: tuple[Gate, ...] = ()
    st: os.stat_result | None = None
    prefixes: list[tuple[str, str, tuple[Gate, ...]]] = field(default_factory=list)
    facts: dict[str, Dir] = field(default_factory=dict)
    own: int = 0


def join(directory: str, name: str) -> str:
    """`directory/name` (`/name` at the root)."""
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def resolve(start: str, parts: list[str], key: str = "", protected: bool = True,
            gates: tuple[Gate, ...] = (), known: dict[str, Dir] | None = None) -> Walked:
    """Walk `parts` (names, as split from a key; `.`, `..` and empty ones as the kernel takes
    them) from the real directory `start`, reached through `gates` as lexical key `key`,
    following every symlink (the last one too, as open(2) does). `protected`:
    `fs.protected_symlinks` is on. `known`: facts of directories just taken (not taken again)."""
    cur = start
    searched: list[Gate] = list(gates)
    seen = set(searched)
    stats: dict[str, os.stat_result] = {}
    prefixes: list[tuple[str, str, tuple[Gate, ...]]] = []
    links = 0
    st = None

    def search(gate: Gate) -> None:
        if gate not in seen:
            seen.add(gate)
            searched.append(gate)

    def lstat(path: str) -> os.stat_result:
        got = stats.get(path)
        if got is None:
            got = stats[path] = os.lstat(path)
        return got

    try:
        for i, part in enumerate(parts):
            todo = [part]
            while todo:
                name = todo.pop()
                if not name:  # (repeated slashes: no lookup)
                    continue
                search(cur)  # a lookup in `cur`, `.` and `..` included
                if name == ".":
                    continue
                if name == "..":
                    cur = os.path.dirname(cur) or "/"
                    continue
                path = join(cur, name)
                st = lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAXSYMLINKS:
                        return Walked(None)
                    if protected:
                        gate = link_gate(st, lstat(cur))
                        if gate is not None:
                            search(gate)
                    target = os.readlink(path)
                    if not target:
                        return Walked(None)
                    if target.startswith("/"):
                        cur = "/"
                    todo.extend(reversed(target.split("/")))
                    continue
                if not stat.S_ISDIR(st.st_mode) and (todo or i < len(parts) - 1):
                    return Walked(None)  # ENOTDIR
                cur = path
            key = f"{key}/{part}" if key else part
            if i < len(parts) - 1 or stat.S_ISDIR(lstat(cur).st_mode):
                prefixes.append((key, cur, tuple(searched)))
        st = lstat(cur)  # (after `..`, the directory it led to)
    except OSError:
        return Walked(None)
    if stat.S_ISLNK(st.st_mode):
        return Walked(None)
    known = known or {}
    facts = {g: known[g] if g in known else dir_facts(g, stats.get(g)) for g in searched if isinstance(g, str)}
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        facts[cur] = dir_facts(cur, st)
        own = facts[cur][2]
    else:
        own = narrowed(mode, acl_of(cur) if needs_acl(mode) else None, st.st_uid)
    return Walked(cur, tuple(searched), st, prefixes, facts, own)
