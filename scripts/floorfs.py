#!/usr/bin/env python3
"""The binding's floor for the benchmarks: the smallest pyfuse3 filesystem that serves a given
tree of files by pread from one backing file (no shards, no indexes, no caches of its own),
with the same kernel settings zvfs uses (long timeouts, keep_cache, no flush).

    floorfs.py BACKING TABLE MOUNTPOINT     # TABLE: lines "path<TAB>offset<TAB>length"

It prints "ready" on stdout once mounted and unmounts on SIGTERM/SIGINT.
"""

import errno
import os
import signal
import stat
import sys

import pyfuse3
import trio

TIMEOUT = 24 * 3600.0


class FloorFS(pyfuse3.Operations):
    def __init__(self, backing: str, table: str):
        super().__init__()
        self.fd = os.open(backing, os.O_RDONLY)
        self.dirs: dict[int, dict[str, int]] = {pyfuse3.ROOT_INODE: {}}
        self.files: dict[int, tuple[int, int]] = {}
        by_path = {"": pyfuse3.ROOT_INODE}
        ino = pyfuse3.ROOT_INODE
        for line in open(table):
            path, off, length = line.rstrip("\n").split("\t")
            parts = path.split("/")
            parent = pyfuse3.ROOT_INODE
            for i, part in enumerate(parts):
                sub = "/".join(parts[: i + 1])
                if sub not in by_path:
                    ino += 1
                    by_path[sub] = ino
                    self.dirs[parent][part] = ino
                    if i == len(parts) - 1:
                        self.files[ino] = (int(off), int(length))
                    else:
                        self.dirs[ino] = {}
                parent = by_path[sub]
        self.sorted = {d: sorted(children.items()) for d, children in self.dirs.items()}

    def _attrs(self, ino):
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        if ino in self.dirs:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFDIR | 0o555, 2, 0
        else:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | 0o444, 1, self.files[ino][1]
        a.st_blksize = 1 << 17  # as zvfs (fuse_ops.BLKSIZE)
        a.entry_timeout = a.attr_timeout = TIMEOUT
        return a

    async def lookup(self, parent, name, ctx=None):
        ino = self.dirs.get(parent, {}).get(os.fsdecode(name))
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(ino)

    async def getattr(self, ino, ctx=None):
        return self._attrs(ino)

    async def opendir(self, ino, ctx):
        return ino

    async def readdir(self, fh, start, token):
        entries = self.sorted[fh]
        for i in range(start, len(entries)):
            name, ino = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(ino), i + 1):
                break

    async def open(self, ino, flags, ctx):
        return pyfuse3.FileInfo(fh=ino, keep_cache=True)

    async def read(self, fh, off, size):
        start, length = self.files[fh]
        size = max(0, min(size, length - off))
        return os.pread(self.fd, size, start + off)


async def main(fs, mountpoint):
    pyfuse3.init(fs, mountpoint, {"ro", "fsname=floorfs", "default_permissions"})
    print("ready", flush=True)
    async with trio.open_nursery() as n:
        async def stop():
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                async for _ in sigs:
                    pyfuse3.terminate()
                    return
        n.start_soon(stop)
        await pyfuse3.main()
        n.cancel_scope.cancel()
    pyfuse3.close(unmount=True)


if __name__ == "__main__":
    backing, table, mountpoint = sys.argv[1:4]
    trio.run(main, FloorFS(backing, table), mountpoint)
