"""A FUSE filesystem whose root is one regular file that can be stat'ed but never opened: its
open is never answered, like a file on a hung NFS server or a dead FUSE mount. Mounted over
a shard file of a local store (tests/test_stalls.py); killing the process aborts its
connection, and every open waiting on it fails.

usage: python hung_file.py MOUNTPOINT SIZE
"""

from __future__ import annotations

import stat
import sys

import pyfuse3
import trio


class HungFile(pyfuse3.Operations):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    async def getattr(self, inode, ctx=None):
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.st_mode = stat.S_IFREG | 0o644
        a.st_size = self.size
        a.st_nlink = 1
        a.st_blksize = 4096
        a.st_blocks = (self.size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = 1_600_000_000 * 10**9
        return a

    async def open(self, inode, flags, ctx):
        await trio.sleep_forever()


def main(mountpoint: str, size: int) -> None:
    options = set(pyfuse3.default_options) | {"fsname=hung_file"}
    options.discard("default_permissions")
    pyfuse3.init(HungFile(size), mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
