"""A persistent disk cache of remote stores' bytes (`-o cache_dir=DIR,cache_size=SIZE`).

Every mount of a remote store used to start cold: each shard index, minishard index and
metadata file was fetched again, and every epoch of a training loop read the same chunk bytes
over the network. `DiskCachedStore` sits between the read-ahead layer and the remote store
(`FsspecStore`) and keeps every byte range it fetches in `DIR/cache.sqlite`, for later reads
of this mount and of every later one, by every front (mount, `serve`, fsspec) and by several
daemons on one machine at once. Local stores get no disk cache: they are on disk already.

Correctness first (docs/reliability.md, the contract):

* Every entry is keyed by the store's identity (the sha256 of its full URL, query string and
  credentials included, and its endpoint: no credential is stored), the key, the object's
  version (ETag or generation, and size: `Version`) and the byte range. An object whose
  version rests on its size and Last-Modified alone is never cached (`cacheable`): a server
  that keeps a fixed Last-Modified, or a rewrite of the same size within its one-second
  resolution, would be served old from the cache by every later mount; nor is one whose
  Last-Modified is within `SETTLE` seconds of its fetch from an HTTP server (a rewrite within
  the same second keeps an ETag made of mtime and size, nginx's). A server whose ETag is mtime and size cannot
  show a same-size replacement that keeps the old mtime (`cp -p`, `rsync -t`): `zvfs cache
  DIR --clear`, or no cache_dir, for such sources. A cached range is served only for the version the store has *confirmed in
  this process*: the version the last response for that key showed. A key not seen yet costs one
  validating request (`Store.size`: a 1-byte ranged GET on HTTP, S3 and GCS, which shows the
  version in the form every read shows it), and only when the cache holds the range asked for
  (of any version); otherwise the read itself is made, so a cold mount makes no more requests
  than one without the cache. A rewritten object shows a new version and misses: its old
  entries are never served (they age out). `zvfs refresh` forgets the confirmed versions, so
  every object is validated again at its next read; a change within a mount is otherwise seen
  as without the cache (by the first request that meets it).
* Every entry carries a crc32c of its identity (name, version, object size, range) and its
  bytes, checked at every read: a bad or truncated entry (a flipped bit on disk), or one whose
  bytes and checksum were moved to another row, is dropped and the range fetched again, never
  served.
* DIR must be the user's own and writable by no one else, and the database's files (if there)
  regular files of the user's, writable by no one else, never symlinks (`secure`): another
  local user could otherwise plant entries or make the daemon write through a link. DIR is
  created 0700 and the database 0600 (O_EXCL|O_NOFOLLOW).
* The size budget holds on disk: an insert first evicts the least recently used entries
  until the database's pages in use (its pages less its free ones: SQLite reuses freed pages,
  so the file never outgrows them) leave room for the new one within the budget less the
  log's share, at most the rows whose pages of the log fit its limit per insert. (Counting the entries' bytes instead
  let the files grow to 1.6x the budget with 4 KiB entries: each takes an overflow page and
  part of a leaf page.) The bytes of the entries are counted in the database (`zvfs cache`). Last use is written at most once per `TOUCH_EVERY` seconds per entry (a hit is a
  read, not a write, most of the time). The write-ahead log is checkpointed every
  `WAL_LIMIT` bytes (a sixteenth of the budget if less) and cut back to that after; a write
  that would take it past its share (three times that) first checks it in whole and cuts it
  to nothing, or is skipped (`_begin`, given the write's frames: `_frames`). So
  the files in DIR stay within `cache_size`, `zvfs cache --clear` included (sampled every ms
  while two processes read and write; 0.6-1.0 MiB for 256 KiB before `_begin`).

Why SQLite (the standard library's `sqlite3`): several daemons and fronts on one machine
share one DIR, so the store must be safe for concurrent processes, and a crash or power loss
must leave it consistent (a half-written entry is rolled back, never read). SQLite in WAL mode
gives concurrent readers with one writer, `busy_timeout` waits for the writer instead of
failing, and every insert, eviction and byte count is one transaction. The `diskcache`
library is SQLite plus files as well, but keys by pickled Python values, has no byte-range or
version notion and adds a dependency; files beside a small index would need their own
crash-safety and inter-process eviction. Blobs are kept in the database: measured on this
machine (/tmp on a virtual disk, WAL, synchronous=NORMAL), a 64 KiB entry takes 0.34 ms to write
and 0.028 ms to read in the database against 0.27 ms and 0.021 ms as files, a 1 MiB entry
6.9 ms and 0.58 ms against 1.0 ms and 0.36 ms: all far below one request to a remote store
(10-100 ms), and inserts are made off the read path (`_in_background`, a system task), so the
one file and its atomic transactions cost nothing a reader waits for. Whether an entry holds a
range is asked of the index alone on the event loop's thread (tens of µs; a hop to a worker
thread took 0.2-0.5 ms on this loaded 2-core machine, and made a cold mount with the cache 20%
slower than one without: 1,000 random 16 KiB chunks by one reader over 10 ms requests), and
only a hit reads its entry, in a worker thread.

Failures of the cache never fail a read: a busy database skips the insert, and a database
that SQLite finds damaged turns the cache off for the process with one warning (`zvfs cache
DIR --clear` starts it anew). The database is created 0600 in a 0700 DIR: it holds the
store's bytes, readable by its owner only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import sqlite3
import stat
import struct
import threading
import time

import crc32c
import trio

from ..errors import MetadataError, ShardChanged
from .base import VERSIONS_KEPT, Entry, SeenVersions, Store, Version

log = logging.getLogger("zvfs.storage")

DB_NAME = "cache.sqlite"
#: the default `cache_size`, and the least accepted: below it the files SQLite keeps (its
#: schema, the WAL and its index: 73-500 KiB measured at cache_size=0 or 1) outgrow the budget;
#: at 256 KiB they hold within it (tests/test_disk_cache.py)
DEFAULT_SIZE, MIN_SIZE = 10 << 30, 256 << 10
#: the format of the entries (PRAGMA user_version); a database of another one is emptied
FORMAT = 2
#: seconds: an object whose Last-Modified is this close to its fetch is not cached
SETTLE = 2.0
#: version tags that change with every rewrite (HTTP/S3 ETag, GCS generation, fsspec's)
STRONG_TAGS = ("etag", "generation", "ETag", "md5Hash")
#: rows an insert may evict (bounded work per insert; the next insert goes on)
EVICT_BATCH = 256
#: seconds between two writes of one entry's last use
TOUCH_EVERY = 10.0
#: WAL: checkpointed every 4 MiB (or a sixteenth of the budget if less), cut back to that after
WAL_LIMIT = 4 << 20
#: seconds a writer waits for another process's transaction
BUSY_MS = 5000
#: bytes of inserts waiting to be written at once; more are not cached (they are held in
#: memory, outside the caches' budget: a 1 MiB insert takes ~7 ms, so a few suffice)
PENDING_LIMIT = 8 << 20
#: the largest entry (an eighth of the budget if less): a hit reads its entry whole (crc32c)
MAX_ENTRY = 16 << 20
#: SQLite's page size (its default), a write-ahead log frame (a page and its header), the
#: log's own header, and the WAL index's file ("-shm")
PAGE, FRAME, LOG_HEADER, SHM = 4096, 4096 + 24, 32, 32 << 10
#: pages of the log one write takes beyond its entry's and its evicted rows' (the row's leaf,
#: the indexes' leaves, the totals, the header and the free list)
TXN_PAGES = 8
#: pages of the log an evicted row takes (its leaf and its two index entries' leaves)
EVICT_PAGES = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    name BLOB NOT NULL,      -- digest of (store identity, key)
    version BLOB NOT NULL,   -- digest of the object's version (size, ETag/generation)
    start INTEGER NOT NULL,  -- byte range [start, stop) of the object
    stop INTEGER NOT NULL,
    total INTEGER NOT NULL,  -- the object's size
    crc INTEGER NOT NULL,    -- crc32c of (name, version, total, start, stop) and data
    used REAL NOT NULL,      -- last use (seconds since the epoch)
    data BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS by_range ON entries(name, version, start, stop);
CREATE INDEX IF NOT EXISTS by_use ON entries(used);
CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (0, 0);
"""


def _first(db: sqlite3.Connection, sql: str, args: tuple = ()) -> tuple | None:
    """The first row of a query (or None), its statement run to the end: a statement left
    unfinished keeps its read snapshot, and then the WAL is never reset (measured: 800 KiB of
    files for a 256 KiB budget)."""
    rows = db.execute(sql, args).fetchall()
    return rows[0] if rows else None


def _digest(*parts: str) -> bytes:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).digest()


def version_digest(version: Version) -> bytes:
    return _digest(json.dumps([version.size, list(version.tag)]))


def checksum(name: bytes, version: bytes, total: int, start: int, data: bytes) -> int:
    """The crc32c of an entry's identity and bytes: moved to another row, it fails."""
    return crc32c.crc32c(data, crc32c.crc32c(name + version + struct.pack("<3q", total, start, start + len(data))))


def cacheable(version: Version | None, fetched: float, settle: bool) -> bool:
    """Whether entries of an object of this version, fetched at `fetched`, may be kept: its tag
    an ETag or generation (not Last-Modified alone), and with `settle` (HTTP servers, whose ETag
    may be made of the mtime; S3's is the content's MD5, GCS's generation changes at every
    write) its Last-Modified (if known) not within SETTLE seconds of the fetch."""
    if version is None or not version.tag:
        return False
    pairs = [version.tag] if isinstance(version.tag[0], str) else version.tag
    if not any(kind in STRONG_TAGS for kind, _ in pairs):
        return False
    return not settle or version.mtime_ns is None or fetched - version.mtime_ns / 1e9 >= SETTLE


def secure(directory: str) -> str:
    """Make DIR (0700) if missing, refuse one another user could write to or plant files in,
    and one this user cannot write (saying why), and create the database 0600
    (O_EXCL|O_NOFOLLOW: never through a link); its path."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        parent = os.path.dirname(os.path.abspath(directory))
        raise MetadataError(f"cache_dir={directory}", f"cannot make it: {parent}: {unwritable(parent) or e.strerror}") from None
    me = os.geteuid()
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or st.st_mode & 0o022:
        raise MetadataError(f"cache_dir={directory}", "must be a directory of this user's that no one else can write "
                                                      f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): chmod 700")
    if why := unwritable(directory):
        raise MetadataError(f"cache_dir={directory}", why)
    path = os.path.join(directory, DB_NAME)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
    for name in (path, path + "-wal", path + "-shm"):
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_mode & 0o022:
            raise MetadataError(name, "not a regular file of this user's that no one else can write (a symlink, "
                                      f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): remove it")
    return path


def unwritable(directory: str) -> str | None:
    """Why this user cannot write in `directory` (None if it can), in words that name the cause:
    the errno alone ("Operation not permitted" for an immutable directory, even to root) read
    as a mount that needs root, and was answered with that hint."""
    if os.access(directory, os.W_OK, effective_ids=True):
        return None
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        return "not writable: on a read-only filesystem"
    st = os.stat(directory)
    if os.geteuid() == 0 or (st.st_uid == os.geteuid() and st.st_mode & 0o200):
        return "not writable: immutable or append-only (lsattr -d shows it; chattr -i)"
    return f"not writable by this user (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"


class DiskCache:
    """The database in DIR: thread-safe, blocking calls (run them in worker threads), but for
    `holds` and `covers`, which are made on one thread (the event loop's) and never wait."""

    def __init__(self, directory: str, size: int = DEFAULT_SIZE):
        if size < MIN_SIZE:
            raise MetadataError(f"cache_size={size}", f"below the least a disk cache needs ({MIN_SIZE >> 10}K)")
        self.directory = directory
        self.size = size
        #: the log's checkpoint limit; the rows one write may evict (their pages of the log
        #: within that limit); the database's share of the budget: less the log's (the limit
        #: twice, and the evictions) and its index's; the largest entry
        self._wal = max(64 << 10, min(WAL_LIMIT, size // 16))
        self._evict_rows = max(1, min(EVICT_BATCH, self._wal // (EVICT_PAGES * FRAME)))
        self._room = size - 3 * self._wal - SHM
        self._largest = min(MAX_ENTRY, size // 8)
        self.path = secure(directory)
        self._reader, self._writer = self._connect(), self._connect()
        self._read_lock, self._write_lock = threading.Lock(), threading.Lock()
        #: index-only queries made on the event loop's thread itself (`holds`, `covers`): tens
        #: of µs, where a hop to a worker thread took 0.2-0.5 ms; they never wait for a lock
        self._prober = self._connect()
        self._prober.execute("PRAGMA busy_timeout=0")
        self.broken: str | None = None
        with self._write_lock:
            self._writer.executescript(SCHEMA)
            if _first(self._writer, "PRAGMA user_version")[0] != FORMAT:  # (entries of another checksum)
                self._writer.executescript(f"BEGIN IMMEDIATE; DELETE FROM entries; UPDATE totals SET bytes=0; "
                                           f"PRAGMA user_version={FORMAT}; COMMIT;")

    def _connect(self) -> sqlite3.Connection:
        wal = self._wal
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_MS / 1000)
        db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        db.execute(f"PRAGMA page_size={PAGE}")  # (a new database's; before WAL mode, which fixes it)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # (WAL: consistent after a crash; the last commits may be lost)
        db.execute(f"PRAGMA wal_autocheckpoint={wal // PAGE}")
        db.execute(f"PRAGMA journal_size_limit={wal}")
        return db

    def close(self) -> None:
        with self._read_lock, self._write_lock:
            self._prober.close()
            self._reader.close()
            self._writer.close()

    def _failed(self, e: sqlite3.Error) -> None:
        """A busy database skips the operation; a damaged one turns the cache off (once)."""
        if isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e)):
            log.debug("disk cache %s: %s", self.directory, e)
            return
        if self.broken is None:
            self.broken = str(e)
            log.warning("disk cache %s unusable (%s): reading without it; 'zvfs cache %s --clear' starts it anew",
                        self.directory, e, self.directory)

    # -- reads

    def covers(self, name: bytes, start: int, stop: int | None) -> bool:
        """Whether an entry of any version holds [start, stop), or [start, end of the object)
        (stop None: any entry of the key)."""
        if self.broken:
            return False
        try:
            if stop is None:
                row = _first(self._prober, "SELECT 1 FROM entries WHERE name=? LIMIT 1", (name,))
            else:
                row = _first(self._prober, "SELECT 1 FROM entries WHERE name=? AND start<=? AND (stop>=? OR stop=total) "
                                            "LIMIT 1", (name, start, stop))
            return row is not None
        except sqlite3.Error as e:
            self._failed(e)
            return False

    def holds(self, name: bytes, version: bytes, start: int, stop: int) -> bool:
        """Whether an entry of that version holds [start, stop) (the index alone: no blob read)."""
        if self.broken:
            return False
        try:
            return _first(self._prober, "SELECT 1 FROM entries WHERE name=? AND version=? AND start<=? AND stop>=? LIMIT 1",
                          (name, version, start, stop)) is not None
        except sqlite3.Error as e:
            self._failed(e)
            return False

    def get(self, name: bytes, version: bytes, start: int, stop: int) -> tuple[bytes, int | None] | None:
        """Bytes [start, stop) of that version of the object, if an entry holds them and its
        checksum is right (a bad entry is deleted); and the entry's id when its last use is
        due to be written (`touch`)."""
        if self.broken:
            return None
        try:
            while True:  # (until an entry passes its checksum, or none is left)
                with self._read_lock:
                    row = _first(self._reader, "SELECT id, start, stop, total, crc, used, data FROM entries WHERE name=? "
                                 "AND version=? AND start<=? AND stop>=? LIMIT 1", (name, version, start, stop))
                if row is None:
                    return None
                rowid, first, last, total, crc, used, data = row
                if len(data) == last - first and checksum(name, version, total, first, data) == crc:
                    return data[start - first:stop - first], (rowid if time.time() - used > TOUCH_EVERY else None)
                log.warning("disk cache %s: an entry failed its checksum: dropped", self.directory)
                if not self._delete(rowid):
                    return None
        except sqlite3.Error as e:
            self._failed(e)
            return None

    def touch(self, rowid: int) -> None:
        try:
            with self._write_lock:
                if self._begin(self._frames()):
                    self._writer.execute("UPDATE entries SET used=? WHERE id=?", (time.time(), rowid))
                    self._writer.execute("COMMIT")
        except sqlite3.Error as e:
            self._failed(e)

    def _begin(self, frames: int) -> bool:
        """Begin a write transaction (the write lock held) if the write-ahead log has room for
        `frames` more bytes within its share of the budget (three times `_wal`); if not,
        check the log into the database and cut it to nothing first (TRUNCATE, which waits
        for readers still on the log). False: still no room, the write is skipped. (The
        autocheckpoint is PASSIVE: it skips frames a reader may still need, and then the log
        only grows: with two processes writing and reading, 13 MB of files were measured for
        a 256 KiB budget.) The log's size is read with the write lock held: no other process
        appends to it. A write's frames are estimated from its entry's pages, `TXN_PAGES` and
        `EVICT_PAGES` per row it may evict (an outside attacker found the log 9-33 KiB over
        its share with pages counted as 4096 bytes and evictions not counted)."""
        db = self._writer
        for attempt in range(2):
            db.execute("BEGIN IMMEDIATE")
            if self._log_size() + frames <= 3 * self._wal:
                return True
            db.execute("ROLLBACK")
            if attempt == 0:
                _first(db, "PRAGMA wal_checkpoint(TRUNCATE)")
        return False

    @staticmethod
    def _frames(entry: int = 0, rows: int = 0) -> int:
        """Bytes of the log a write takes at most: an entry of `entry` bytes (its overflow
        pages), `rows` evicted rows, and the pages every write touches."""
        pages = (entry // (PAGE - 4) + 1 if entry else 0) + TXN_PAGES + EVICT_PAGES * rows
        return LOG_HEADER + pages * FRAME

    def _log_size(self) -> int:
        try:
            return os.stat(self.path + "-wal").st_size
        except FileNotFoundError:
            return 0

    # -- writes

    def put(self, name: bytes, version: bytes, start: int, data: bytes, object_size: int) -> None:
        """Keep `data` as bytes [start, start+len) of that version of the object (of
        `object_size` bytes), evicting the least recently used entries first so that the
        database's pages in use stay within its share of the budget (`_room`)."""
        if self.broken or not data or len(data) > self._largest:
            return
        cost = len(data) + PAGE  # (with its row, index entry and overflow pages' headers)
        try:
            with self._write_lock:
                db = self._writer
                if not self._begin(self._frames(len(data), self._evict_rows)):
                    return
                try:
                    held = _first(db, "SELECT bytes FROM totals")[0]
                    if self._in_use(db) + cost > self._room:
                        held -= self._evict(self._in_use(db) + cost - self._room)
                    if self._in_use(db) + cost <= self._room:
                        cur = db.execute("INSERT OR IGNORE INTO entries (name, version, start, stop, total, crc, used, data) "
                                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (name, version, start, start + len(data),
                                                                             object_size, checksum(name, version, object_size,
                                                                                                   start, data), time.time(),
                                                                             data))
                        held += len(data) if cur.rowcount == 1 else 0
                    db.execute("UPDATE totals SET bytes=?", (held,))
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            self._failed(e)

    @staticmethod
    def _in_use(db: sqlite3.Connection) -> int:
        """Bytes of the database's pages in use (its file's size less its free pages)."""
        return (_first(db, "PRAGMA page_count")[0] - _first(db, "PRAGMA freelist_count")[0]) * PAGE

    def _evict(self, need: int) -> int:
        """Delete the least recently used entries, `need` bytes' worth (at most `_evict_rows`
        rows: their pages of the log are counted in `_begin`); the bytes freed. (In the
        caller's transaction.)"""
        freed, gone = 0, []
        for rowid, n in self._writer.execute("SELECT id, stop - start FROM entries ORDER BY used LIMIT ?", (self._evict_rows,)):
            gone.append((rowid,))
            freed += n
            if freed >= need:
                break
        self._writer.executemany("DELETE FROM entries WHERE id=?", gone)
        return freed

    def _delete(self, rowid: int) -> bool:
        """Delete one entry; False if the log has no room for it now."""
        with self._write_lock:
            db = self._writer
            if not self._begin(self._frames(rows=1)):
                return False
            try:
                n = _first(db, "SELECT stop - start FROM entries WHERE id=?", (rowid,))
                if n is not None:
                    db.execute("DELETE FROM entries WHERE id=?", (rowid,))
                    db.execute("UPDATE totals SET bytes=bytes-?", (n[0],))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return True

    # -- `zvfs cache DIR`, `zvfs stats`

    def held(self) -> int:
        """Bytes of the entries (every daemon's)."""
        try:
            with self._read_lock:
                return _first(self._reader, "SELECT bytes FROM totals")[0]
        except sqlite3.Error:
            return 0

    def summary(self) -> dict:
        with self._read_lock:
            entries, = _first(self._reader, "SELECT count(*) FROM entries")
        return {"directory": self.directory, "entries": entries, "bytes": self.held(), "size": self.size,
                "on_disk": disk_usage(self.directory)}

    @staticmethod
    def remove(directory: str) -> None:
        """Delete the database files (`zvfs cache DIR --clear` of a database SQLite cannot read)."""
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, DB_NAME + suffix))

    def clear(self) -> None:
        """Delete every entry, `_evict_rows` per transaction (one DELETE of them all took the
        log past its share: 353 KiB of files for 256 KiB, `zvfs cache --clear` while daemons
        read), then make the file small (VACUUM: of the schema alone)."""
        db = self._writer
        freed = 1
        while freed:
            with self._write_lock:
                if not self._begin(self._frames(rows=self._evict_rows)):
                    raise sqlite3.OperationalError("database is busy (readers hold its log): try again")
                try:
                    freed = self._evict(math.inf)
                    db.execute("UPDATE totals SET bytes=bytes-?", (freed,))
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        with self._write_lock:
            db.execute("VACUUM")
            _first(db, "PRAGMA wal_checkpoint(TRUNCATE)")


def damaged(e: BaseException) -> bool:
    """An error that says the database file is damaged (not that it is busy or unreachable)."""
    return isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError)


def disk_usage(directory: str) -> int:
    """Bytes the cache's files take (the database, its WAL and shared-memory index)."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(os.path.join(directory, DB_NAME + suffix)).st_size
    return total


class DiskCachedStore(Store):
    """A remote store with `DiskCache` below it (see the module's docstring)."""

    cache_name = "disk"

    def __init__(self, inner: Store, cache: DiskCache, identity: str, settle: bool = False):
        self.inner = inner
        self.settle = settle  # (`cacheable`)
        self.cache = cache
        self.identity = identity
        self.display = inner.display
        self._confirmed = SeenVersions()
        self._validating: dict[str, trio.Event] = {}
        #: key -> (version, start, stop) of the last range `cached` missed: the window the read-ahead
        #: layer then fetches holds it, so it is not looked up again (a miss cost two lookups)
        self._missed: dict[str, tuple[Version, int, int]] = {}
        self._pending = 0  # bytes of inserts not written yet
        self._writes: set[trio.Event] = set()
        self.requests = self.bytes = self.hits = self.misses = 0

    @property
    def patience(self) -> float:  # type: ignore[override]
        return self.inner.patience

    def cache_stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "bytes": self.cache.held()}

    def forget_versions(self) -> None:
        """`zvfs refresh`: every object is validated again at its next read."""
        self._confirmed.clear()

    async def _validate(self, key: str) -> Version | None:
        """The key's version, asked of the store once (concurrent callers wait for that one)."""
        while (busy := self._validating.get(key)) is not None:
            await busy.wait()
            if key in self._confirmed:
                return self._confirmed[key]
        done = self._validating[key] = trio.Event()
        try:
            self.requests += 1
            await self.inner.size(key)
            version = await self.inner.current(key)
            self._confirmed.seen(key, version)
            return version
        finally:
            del self._validating[key]
            done.set()

    @staticmethod
    def _span(version: Version, start: int, length: int | None) -> tuple[int, int]:
        """(start, stop) of a read in the object of that version (suffix and open ranges resolved)."""
        if start < 0:
            return max(0, version.size + start), version.size
        stop = version.size if length is None else min(version.size, start + length)
        return start, max(start, stop)

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        if length == 0:
            return b""
        data, version = await self.read_version(key, start, length)
        if expect is not None:
            if data is None:
                raise ShardChanged(key, "deleted while mounted")
            if not expect.same(version):
                raise ShardChanged(key)
        return data

    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        if length == 0 or self.cache.broken:
            return await self._fetch(key, start, length)
        name = _digest(self.identity, key)
        version = self._confirmed.get(key)
        if version is None:
            stop = None if start < 0 or length is None else start + length
            if not self.cache.covers(name, start, stop):
                return await self._fetch(key, start, length)  # nothing to validate for: the read itself
            version = await self._validate(key)
            if version is None or not version.tag:
                return await self._fetch(key, start, length)
        first, stop = self._span(version, start, length)
        missed = self._missed.pop(key, None)  # (just missed: a window around it cannot be cached either)
        if stop > first and not (missed is not None and missed[0] is version and first <= missed[1] and missed[2] <= stop):
            data = await self.cached(key, first, stop, None)
            if data is not None:
                return data, version
        self.misses += 1
        return await self._fetch(key, start, length)

    async def cached(self, key: str, start: int, stop: int, expect: Version | None) -> bytes | None:
        """Bytes [start, stop) of the key if the cache holds them for the version confirmed in
        this process, which must be `expect` (if given); None otherwise (no request)."""
        version = self._confirmed.get(key)
        if version is None or not version.tag or self.cache.broken or (expect is not None and not expect.same(version)):
            return None
        first, stop = self._span(version, start, stop - start)
        if first != start or stop <= first:
            return None
        name, tag = _digest(self.identity, key), version_digest(version)
        found = await trio.to_thread.run_sync(self.cache.get, name, tag, first, stop) if self.cache.holds(
            name, tag, first, stop) else None
        if found is None:
            if len(self._missed) > VERSIONS_KEPT:
                self._missed.clear()
            self._missed[key] = (version, first, stop)
            return None
        self.hits += 1
        data, touch = found
        if touch is not None:
            self._in_background(0, self.cache.touch, touch)
        return data

    async def _fetch(self, key: str, start: int, length: int | None) -> tuple[bytes | None, Version | None]:
        self.requests += 1
        try:
            data, version = await self.inner.read_version(key, start, length)
        except ShardChanged:
            self._confirmed.pop(key, None)
            raise
        self.bytes += len(data or b"")
        self._confirmed.seen(key, version)
        if data and not self.cache.broken and cacheable(version, time.time(), self.settle):
            first, stop = self._span(version, start, length)
            if stop - first == len(data) and self._pending + len(data) <= PENDING_LIMIT:
                self._pending += len(data)
                self._in_background(len(data), self.cache.put, _digest(self.identity, key), version_digest(version),
                                    first, data, version.size)
        return data, version

    def _in_background(self, held: int, write, *args) -> None:
        """A write to the database in a worker thread, off the read path (a system task);
        `held`: bytes it keeps in memory until written. Counted in `_writes` from now, not from
        when the task starts: `aclose` right after a read (`zvfs cat`) closed the database
        before the task's first step, and its insert then turned the cache off with a warning."""
        done = trio.Event()
        self._writes.add(done)
        trio.lowlevel.spawn_system_task(self._write, done, held, write, *args)

    async def _write(self, done: trio.Event, held: int, write, *args) -> None:
        """(must not raise: a system task)"""
        try:
            await trio.to_thread.run_sync(write, *args)
        except BaseException as e:  # (cancelled at the end of the run, or anything else: not written)
            log.debug("disk cache: write abandoned: %r", e)
        finally:
            self._pending -= held
            self._writes.discard(done)
            done.set()

    async def current(self, key: str) -> Version | None:
        return await self.inner.current(key)

    async def size(self, key: str) -> int | None:
        version = self._confirmed.get(key)
        if version is not None:
            return version.size
        size = await self.inner.size(key)
        self._confirmed.seen(key, await self.inner.current(key))
        return size

    async def list(self, prefix: str) -> list[Entry] | None:
        return await self.inner.list(prefix)

    async def aclose(self) -> None:
        """Wait for the inserts in flight, then close the store below."""
        for done in list(self._writes):
            await done.wait()
        self.cache.close()
        await self.inner.aclose()
