"""Which of the directories a local store remembers may have changed since the last look
(`LocalStore.directories_changed`), from inotify instead of a stat of each every second.

A mount that other users read looks every second for directories whose owner, group, bits or
ACL changed in the store. Polling cost one lstat per remembered directory: an idle mount that
had walked 2,421 directories spent 3-6% of a core on it. Here each directory is watched
(`IN_ATTRIB`: chmod, chown, setfacl; `IN_CREATE`/`IN_MOVED_TO` in its parent and
`IN_DELETE_SELF`/`IN_MOVE_SELF` on itself: a directory replaced; `IN_DELETE`/`IN_MOVED_FROM` in
its parent: a directory removed whose `IN_DELETE_SELF` never comes while a descriptor below it
is open, as the store's own shard descriptors are, which pin its dentry: an outside attacker's
`rm -rf` of an array went unseen) and a look reads the events
that came since the last one: only the directories they name are compared with what the store
read of them, and those are watched again (a replaced directory is another inode). A directory
is watched before it is first compared, so a change before the watch is seen by the comparison
and one after it by an event. Directories on filesystems whose changes inotify may not see
(network and FUSE filesystems: a change made on another machine) are compared at every look,
as are those past the watch limit (`fs.inotify.max_user_watches`); a queue overflow compares
everything once. Without inotify at all (no instance left), everything is compared every time.
"""

from __future__ import annotations

import logging
import os
import select
from typing import Iterable

from inotify_simple import INotify, flags

log = logging.getLogger("zvfs.storage")

_MASK = (flags.ATTRIB | flags.CREATE | flags.MOVED_TO | flags.DELETE | flags.MOVED_FROM | flags.DELETE_SELF
         | flags.MOVE_SELF | flags.ONLYDIR | flags.DONT_FOLLOW | flags.EXCL_UNLINK)
#: an event that may mean the watched inode is no longer the one the path names
_REPLACED = flags.CREATE | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED


class DirectoryWatch:
    """Watches directories by path; `to_compare(paths)` says which of `paths` to compare now.
    Called from one thread at a time (the store's check runs in a worker thread)."""

    def __init__(self) -> None:
        self._inotify: INotify | None = None
        self._poller = select.poll()
        self._failed = False  # no inotify instance could be had: compare everything
        self._paths_of: dict[int, set[str]] = {}  # watch descriptor -> the paths it watches
        self._wd_of: dict[str, int] = {}
        self._again: set[str] = set()  # watched paths to watch again (maybe another inode now)
        self._polled: set[str] = set()  # paths compared at every look
        #: the paths the events of the last look named (entries of a watched directory too)
        self.evented: set[str] = set()

    def _instance(self) -> INotify | None:
        if self._inotify is None and not self._failed:
            try:
                self._inotify = INotify(nonblocking=True)
                self._poller = select.poll()
                self._poller.register(self._inotify.fileno(), select.POLLIN)
            except OSError as e:  # (EMFILE: fs.inotify.max_user_instances)
                log.warning("directory permissions are looked at by a stat of each every second (no inotify: %s)", e)
                self._failed = True
        return self._inotify

    def quiet(self) -> bool:
        """Nothing to compare since the last look, as far as the watches tell (no event
        waiting, nothing compared at every look): one poll, on the loop."""
        return self._inotify is not None and not self._polled and not self._poller.poll(0)

    def to_compare(self, paths: Iterable[str], unwatched: frozenset[str]) -> set[str] | None:
        """Of `paths` (every directory remembered now), the ones to compare with what was read
        of them: new ones, those named by events since the last look, and those not watched
        (below a mount point in `unwatched`, or past the watch limit); None: all of them."""
        inotify = self._instance()
        if inotify is None:
            return None
        compare: set[str] = set()
        self.evented = evented = set()
        overflow = False
        try:
            events = inotify.read(timeout=0)
        except OSError:  # (closed meanwhile by `zvfs refresh`: it reads everything again anyway)
            return None
        for event in events:
            if event.mask & flags.Q_OVERFLOW:
                overflow = True
                continue
            for base in self._paths_of.get(event.wd, ()):
                path = os.path.join(base, event.name) if event.name else base
                compare.add(path)
                evented.add(path)
                if event.mask & _REPLACED and path in self._wd_of:
                    self._again.add(path)
            if event.mask & flags.IGNORED:  # (the watch is gone: its inode was deleted)
                for base in self._paths_of.pop(event.wd, ()):
                    if self._wd_of.get(base) == event.wd:
                        del self._wd_of[base]
        if overflow:
            self._again.update(self._wd_of)
        for path in paths:
            if path in self._polled:
                compare.add(path)
            elif path not in self._wd_of or path in self._again:
                compare.add(path)
                self._watch(inotify, path, unwatched)
        self._again.clear()
        return None if overflow else compare

    def _watch(self, inotify: INotify, path: str, unwatched: frozenset[str]) -> None:
        if _below(unwatched, path):
            self._polled.add(path)
            return
        try:
            wd = inotify.add_watch(path, _MASK)
        except OSError:  # ENOSPC: past max_user_watches; ENOENT: gone (compared, then watched when back)
            old = self._wd_of.pop(path, None)
            if old is not None:
                self._paths_of.get(old, set()).discard(path)
            if not os.path.lexists(path):
                return
            self._polled.add(path)
            return
        old = self._wd_of.get(path)
        if old is not None and old != wd:
            self._paths_of.get(old, set()).discard(path)
        self._wd_of[path] = wd
        self._paths_of.setdefault(wd, set()).add(path)

    def close(self) -> None:
        """Every watch let go of (`zvfs refresh`, the store closed); a next look starts anew."""
        if self._inotify is not None:
            self._inotify.close()
        self._inotify = None
        self._paths_of.clear()
        self._wd_of.clear()
        self._again.clear()
        self._polled.clear()


def _below(points: frozenset[str], path: str) -> bool:
    """`path` (absolute, no symlinks) is one of `points` or below one."""
    while path not in points:
        if path == "/":
            return False
        path = path.rpartition("/")[0] or "/"
    return True
