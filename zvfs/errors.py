"""The two kinds of failure zvfs distinguishes.

Metadata problems are found at mount time and stop the mount with one line naming the file
(`MetadataError`). Problems in the bytes of one shard are found at read time and cost only the
files that live in that shard (`CorruptShardError`, served as EIO); the mount stays up.
"""


class ZvfsError(Exception):
    """Base class: every message is one line fit for a terminal or a journal."""


class MetadataError(ZvfsError):
    """Unusable metadata or source: the mount (or `ls`/`inspect`) refuses to start."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


class CorruptShardError(ZvfsError):
    """A shard (or shard index) whose bytes are inconsistent; its chunks read as EIO."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"corrupt shard {key}: {problem}")
        self.key = key
        self.problem = problem


class ShardChanged(ZvfsError):
    """A key's bytes are no longer the version a read expected (rewritten, replaced, truncated
    or deleted while mounted). Never cached: the caller drops what it derived from the old
    version (shard index, chunk table) and either reads the new version or answers EIO."""

    def __init__(self, key: str, problem: str = "changed while mounted"):
        super().__init__(f"{key}: {problem}")
        self.key = key


class StorageError(ZvfsError):
    """The backend failed to deliver bytes (I/O error, network fault after retries)."""


class TooManyOpen(StorageError):
    """No room under the process's descriptor limit (RLIMIT_NOFILE) for one more shard held
    open: the open is refused (ENFILE), and what is open goes on reading."""


class DirectoryTooLarge(StorageError):
    """A store directory whose listing would take more than the memory budget: EIO, one line
    naming the option to raise."""


class OptionError(ZvfsError):
    """A mount option or command-line argument that zvfs does not accept."""


class Gone(ZvfsError):
    """A file that was there is no longer stored (a chunk whose shard lost it): ENOENT."""


class Stale(ZvfsError):
    """An inode number of a listing that no longer holds (its directory changed since): the
    kernel looks the name up again (ESTALE)."""


_SAID: set[str] = set()


def first_time(message: str) -> bool:
    """Whether `message` is said for the first time (a problem is logged once, not on every
    read or listing that meets it; bounded)."""
    if message in _SAID:
        return False
    if len(_SAID) >= 4096:
        _SAID.clear()
    _SAID.add(message)
    return True
