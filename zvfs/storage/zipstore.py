"""A zip archive as a store: the keys are its entries, read by range from one key of another
store (tensorstore's `zip` kvstore driver is the model).

Zipped OME-Zarr (`.ozx`, OME-NGFF RFC-9: ngff-zarr writes them), zarr-python's `ZipStore` and
any zip of a store directory are one object whose central directory works like a shard index.
Opening reads the end records with one suffix read of `TAIL` bytes (the end of central
directory record with the longest comment, plus the ZIP64 locator and record before it: small
archives' central directories come with it), then the rest of the central directory, if any,
with one range read. Entries are located from it; an entry's first read also reads its local
header (its name and extra field lengths may differ from the central directory's: the data
offset is kept afterwards), together with the entry itself when it is small (`SMALL`), so
reading a small entry costs one request. Stored entries are read by range; deflated ones
whole (CRC-32 checked; an entry declared larger than the cache is EIO, and its inflation stops
at the declared size), kept in the mount's cache of decoded data. Other methods and encrypted entries are EIO, with one log line.
Concurrent reads of one entry share its inflation (the cache's single flight), and the entries
being inflated at once hold at most the cache's size (`Inflating`): 16 readers of 16 deflated
39 MiB entries under the default budget (a 40 MiB decoded share) inflated them all at once, a
peak RSS of 873 MB; under memory=128M, 16 entries of 7 MiB reached 158 MiB, 74-86 MiB now.

Every entry's version is derived from the archive's (its tag holds the archive's tag): a
rewritten or replaced archive gives every entry a new version, so nothing located in the old
central directory is read from the new archive (the consistency model of docs/reliability.md:
each byte range is read expecting the archive's version). A central directory read from an
archive that is not settled (a local file changed within `SETTLE`) is read again on its next
use, like any index.

Bounds: the central directory is held whole, so its size, and the entries it holds (estimated
at `ENTRY_COST` bytes each besides their names), must fit `max_directory` (the mount's
`max_metadata`). A central directory that lies (an entry whose bytes reach past the central
directory, or into the next entry's local header, an entry at another entry's offset) costs
the entries concerned EIO; one whose records do not parse, or that lies about its own place,
is a one-line error at mount time and EIO afterwards.
"""

from __future__ import annotations

import array
import bisect
import logging
import struct
import zlib

import trio

from ..errors import CorruptShardError, MetadataError, ShardChanged, StorageError, TooManyOpen, ZvfsError, first_time
from .base import Entries, Store, Version
from .cache import CoalescingCache, decoded_size
from .local import LocalStore

log = logging.getLogger("zvfs.zip")

EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
LOC64 = struct.Struct("<4sLQL")  # ZIP64 end of central directory locator
EOCD64 = struct.Struct("<4sQ2H2L4Q")  # ZIP64 end of central directory record (without extensible data)
CEN = struct.Struct("<4s6H3L5H2L")  # central directory file header
LOC = struct.Struct("<4s5H3L2H")  # local file header
SIG_EOCD, SIG_LOC64, SIG_EOCD64, SIG_CEN, SIG_LOC = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06", b"PK\x01\x02", b"PK\x03\x04"
#: the archive's last bytes that hold its end records whatever its comment's length (at most 65535)
TAIL = EOCD.size + 0xFFFF + LOC64.size + EOCD64.size
#: entries up to this size are read with their local header, in one request
SMALL = 64 << 10
#: bytes read past the local header's name, for a local extra field longer than the central one
SLACK = 1024
#: memory an entry of the central directory takes while it is read, besides its name's
#: characters (measured with tracemalloc: 100,000 entries of 10-character names held 115 bytes
#: each once read, 237 at the peak of the parse, which sorts them by name and by offset; the
#: parse took 14 us per entry)
ENTRY_COST = 230
STORED, DEFLATED = 0, 8
#: entries inflated in a worker thread from this size on (zlib releases the GIL)
THREADED = 1 << 20


class Directory:
    """An archive's central directory, as sorted columns (one row per entry name)."""

    __slots__ = ("version", "names", "utf8", "lho", "csize", "usize", "crc", "method", "limit", "data", "problems",
                 "skipped", "tail", "tail_start")
    #: the columns of one row per entry read from the central directory
    COLUMNS = ("names", "utf8", "lho", "csize", "usize", "crc", "method")

    def __init__(self, version: Version):
        self.version = version  # the archive's, the central directory was read from
        self.names: list[str] = []
        self.utf8 = array.array("b")  # names stored in UTF-8 (else code page 437)
        self.lho = array.array("q")  # local header offsets, in the archive
        self.csize = array.array("q")
        self.usize = array.array("q")
        self.crc = array.array("I")
        self.method = array.array("H")
        self.limit = array.array("q")  # where the entry's bytes must end (the next local header, the central directory)
        self.data = array.array("q")  # data offsets once a local header was read; -1: not yet
        self.problems: dict[int, tuple[str, bool]] = {}  # rows that cannot be read -> (why, whether corrupt)
        self.skipped: list[str] = []  # names that are not relative paths (never shown)
        self.tail, self.tail_start = b"", 0  # the archive's last bytes, read with the end records

    def stored_name(self, i: int) -> bytes:
        """The name as the archive stores it (its local header must say the same)."""
        return self.names[i].encode("utf-8" if self.utf8[i] else "cp437", "replace")

    def find(self, key: str) -> int | None:
        i = bisect.bisect_left(self.names, key)
        return i if i < len(self.names) and self.names[i] == key else None

    def version_of(self, i: int) -> Version:
        z = self.version
        return Version(self.usize[i], ("zip", z.size, z.tag, self.lho[i]), z.mtime_ns, z.mode, z.uid, z.gid, z.settled)

    def modes(self) -> tuple[int | None, int | None]:
        """The bits files and directories show: the archive's read bits (a local file's, as a
        reader sees them), and search bits where they are readable; None where unknown."""
        return _modes(self.version.mode)

    def list(self, prefix: str) -> Entries | None:
        """Names directly below `prefix`; directories are implied by names (and by entries
        ending in `/`). Each child directory's names are skipped in one bisection."""
        p = f"{prefix}/" if prefix else ""
        names, out, seen = self.names, Entries(), set()
        i = bisect.bisect_left(names, p)
        if p and (i == len(names) or not names[i].startswith(p)):
            return None
        z = self.version
        file_mode, dir_mode = self.modes()
        while i < len(names) and names[i].startswith(p):
            rest = names[i][len(p):]
            child, slash, _ = rest.partition("/")
            if child and child not in seen:
                seen.add(child)
                out.add(child, bool(slash), None if slash else self.usize[i], dir_mode if slash else file_mode,
                        z.mtime_ns, z.uid, z.gid)
            i = bisect.bisect_left(names, f"{p}{child}0", i + 1) if slash else i + 1  # ("0" follows "/")
        return out


def _plain(name: str) -> bool:
    """A relative path of plain components (`a/b`, `a/` for a directory entry)."""
    return "\0" not in name and "\\" not in name and all(part not in ("", ".", "..") for part in name.removesuffix("/").split("/"))


def _unreadable(flags: int, method: int, csize: int, usize: int, disk: int, crc: int) -> tuple[str, bool] | None:
    """Why an entry cannot be read, and whether that is a lie (corrupt) or a limit; None if it can."""
    if disk != 0:
        return "on another disk", False
    if flags & 1:
        return "encrypted (not read)", False
    if method not in (STORED, DEFLATED):
        return f"compression method {method} (only stored and deflate are read)", False
    if method == STORED and csize != usize:
        return f"stored with {csize} bytes for {usize}", True
    if usize == 0 and crc != 0:  # (an empty entry is read without its data: no CRC-32 check after)
        return "empty, with the CRC-32 of some bytes", True
    return None


def _zip64_extra(extra: bytes, usize: int, csize: int, lho: int, disk: int) -> tuple[int, int, int, int] | None:
    """The sizes and offset the ZIP64 extra field gives for the central values that are all
    ones (in that order); None when the field is missing or short."""
    p = 0
    while p + 4 <= len(extra):
        tag, n = struct.unpack_from("<2H", extra, p)
        if tag == 1:
            field, q = extra[p + 4:p + 4 + n], 0
            values = [usize, csize, lho]
            for k, full in enumerate((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)):
                if values[k] == full:
                    if q + 8 > len(field):
                        return None
                    values[k] = struct.unpack_from("<Q", field, q)[0]
                    q += 8
            if disk == 0xFFFF:
                if q + 4 > len(field):
                    return None
                disk = struct.unpack_from("<L", field, q)[0]
            return values[0], values[1], values[2], disk
        p += 4 + n
    return None


def end_records(tail: bytes, tail_start: int) -> tuple[int, int, int]:
    """(central directory offset in the archive, its size, its entry count) from the archive's
    last bytes (`tail`, which begins at `tail_start`); ValueError says what is wrong."""
    pos = len(tail) - EOCD.size
    while True:
        pos = tail.rfind(SIG_EOCD, 0, pos + 4)
        if pos < 0:
            raise ValueError("neither a directory nor a zip archive (no end of central directory record)")
        _, disk, cd_disk, _, count, cd_size, cd_offset, comment = EOCD.unpack_from(tail, pos)
        if pos + EOCD.size + comment == len(tail):
            break
        pos -= 1
    end = tail_start + pos  # where the central directory (or the ZIP64 record) ends
    loc = pos - LOC64.size
    if loc >= 0 and tail[loc:loc + 4] == SIG_LOC64:
        _, _, _, disks = LOC64.unpack_from(tail, loc)
        rec = loc - EOCD64.size
        if disks > 1 or rec < 0 or tail[rec:rec + 4] != SIG_EOCD64:
            raise ValueError("a ZIP64 locator without its record, or an archive of several disks")
        _, _, _, _, disk, cd_disk, _, count, cd_size, cd_offset = EOCD64.unpack_from(tail, rec)
        end = tail_start + rec
    if disk != 0 or cd_disk != 0:
        raise ValueError("an archive of several disks (not read)")
    concat = end - cd_size - cd_offset  # bytes before the archive (a self-extractor's, say): zipfile allows them
    if concat < 0:
        raise ValueError(f"the central directory ({cd_size} bytes at {cd_offset}) overlaps its end record at {end}")
    return cd_offset + concat, cd_size, count


def parse_directory(cd: bytes, start: int, version: Version, budget: int) -> Directory:
    """The entries of central directory bytes `cd` found at `start` of an archive of
    `version`. Records that do not parse, or more than `budget` bytes held, are a ValueError;
    entries whose bytes cannot be where the directory says are kept with their problem."""
    d = Directory(version)  # (filled in directory order, then put in name order)
    problems: dict[int, tuple[str, bool]] = {}
    p, held = 0, len(cd)
    while p < len(cd):
        if p + CEN.size > len(cd) or cd[p:p + 4] != SIG_CEN:
            raise ValueError(f"central directory record {len(d.names)} at {start + p}: not a central directory record")
        (_, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, disk, _, _, lho) = CEN.unpack_from(cd, p)
        raw = cd[p + CEN.size:p + CEN.size + nlen]
        extra = cd[p + CEN.size + nlen:p + CEN.size + nlen + elen]
        p += CEN.size + nlen + elen + clen
        if p > len(cd):
            raise ValueError(f"central directory record {len(d.names)}: runs past the central directory")
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        if not _plain(name):
            d.skipped.append(name)
            continue
        problem = None
        if 0xFFFFFFFF in (usize, csize, lho) or disk == 0xFFFF:
            big = _zip64_extra(extra, usize, csize, lho, disk)
            if big is None:
                problem = ("ZIP64 sizes missing from its extra field", True)
            else:
                usize, csize, lho, disk = big
        problem = problem or _unreadable(flags, method, csize, usize, disk, crc)
        if problem:
            problems[len(d.names)] = problem
        held += ENTRY_COST + len(name)
        if held > budget:
            raise ValueError(f"more than {len(d.names)} entries, taking more than the budget of {budget} bytes")
        d.names.append(name)
        d.utf8.append(bool(flags & 0x800))
        d.lho.append(lho)
        d.csize.append(csize)
        d.usize.append(usize)
        d.crc.append(crc)
        d.method.append(min(method, 0xFFFF))
    # name order; of a name given twice, the last entry (as zipfile's getinfo, hence zarr-python, reads it)
    order = sorted(range(len(d.names)), key=d.names.__getitem__)  # (stable: directory order among equals)
    order = [i for k, i in enumerate(order) if k + 1 == len(order) or d.names[order[k + 1]] != d.names[i]]
    for column in Directory.COLUMNS:
        values = getattr(d, column)
        setattr(d, column, type(values)(values.typecode, (values[i] for i in order)) if isinstance(values, array.array)
                else [values[i] for i in order])
    d.problems = {k: problems[i] for k, i in enumerate(order) if i in problems}
    d.skipped = d.skipped[:8]
    # each entry's bytes end before the next local header, and before the central directory
    d.limit = array.array("q", bytes(8 * len(order)))
    d.data = array.array("q", [-1]) * len(order)
    by_offset = sorted(range(len(order)), key=d.lho.__getitem__)
    for k, i in enumerate(by_offset):
        nxt = min(d.lho[by_offset[k + 1]], start) if k + 1 < len(by_offset) else start
        if k + 1 < len(by_offset) and d.lho[by_offset[k + 1]] == d.lho[i]:
            d.problems[i] = d.problems[by_offset[k + 1]] = ("two entries at one offset", True)
        d.limit[i] = nxt
        if d.lho[i] + LOC.size + len(d.stored_name(i)) + d.csize[i] > nxt and i not in d.problems:
            d.problems[i] = (f"{d.csize[i]} bytes at {d.lho[i]} reach past {nxt}", True)
    return d


def inflate(data: bytes, usize: int, crc: int) -> bytes | str:
    """A deflated entry's bytes (exactly `usize`, never more is produced), or what is wrong."""
    z = zlib.decompressobj(-15)
    try:
        out = z.decompress(data, usize + 1)
    except zlib.error as e:
        return f"deflate data: {e}"
    if len(out) != usize or not z.eof:
        return f"deflate data of {len(out)}{'+' if len(out) > usize else ''} bytes for {usize}"
    if zlib.crc32(out) != crc:
        return "CRC-32 mismatch"
    return out


class Inflating:
    """Bytes held by the inflations under way, at most `total`: an inflation waits until its
    declared sizes fit beside the others' (one alone always may: larger entries are refused
    before)."""

    def __init__(self, total: int):
        self.total = total
        self.held = 0
        self._lot = trio.lowlevel.ParkingLot()

    async def acquire(self, n: int) -> None:
        while self.held and self.held + n > self.total:
            await self._lot.park()
        self.held += n

    def release(self, n: int) -> None:
        self.held -= n
        self._lot.unpark_all()


class ZipStore(Store):
    """The entries of the archive `key` of `inner` (`key` "": the inner store's root object)."""

    def __init__(self, inner: Store, key: str, display: str, max_directory: int = 64 << 20,
                 inflated: CoalescingCache | None = None):
        self.inner = inner
        self.key = key
        self.display = display
        self.max_directory = max_directory
        self._dir: Directory | None = None
        self._opened = False  # a central directory was read: later problems are EIO, not refusals
        self._loading = trio.Lock()
        #: inflated entries (the mount's decoded cache: they count in its share of the budget)
        self.inflated = inflated if inflated is not None else CoalescingCache(64 << 20, decoded_size)
        self._inflating = Inflating(self.inflated.max_bytes)
        #: the archive's (mode, uid, gid) as last read, and whether its path names nothing now
        #: (`directories_changed`): kept while the central directory is read again
        self._root: tuple[int | None, int | None, int | None] = (None, None, None)
        self._gone = False
        #: the archive's state at the watch's last look (`directories_changed`), first the one
        #: its central directory was first read from (None: gone)
        self._seen: tuple | None | object = _UNSEEN

    @property
    def patience(self) -> float:  # type: ignore[override]
        return self.inner.patience

    # -- the central directory

    async def _directory(self) -> Directory:
        d = self._dir
        if d is not None:
            now = await self.inner.current(self.key)
            if now is None:  # remote: not seen since a read that found it changed; local: deleted
                return d  # (reads expecting its version say so)
            if d.version.same(now) and now.settled:
                d.version = now
                return d
        async with self._loading:
            if self._dir is not d and self._dir is not None:
                return self._dir  # read meanwhile
            try:
                self._dir = await self._read_directory()
            except ValueError as e:
                self._dir = None
                if not self._opened:
                    raise MetadataError(self.display, str(e)) from None
                raise StorageError(f"{self.display}: {e}") from None
            self._opened = True
            return self._dir

    async def _read_directory(self) -> Directory:
        tail, version = await self.inner.read_version(self.key, -TAIL)
        if tail is None or version is None:
            raise ValueError("no such file")
        tail_start = version.size - len(tail)
        cd_start, cd_size, _ = end_records(tail, tail_start)  # (the count: bounded by the bytes, not trusted)
        if cd_size > self.max_directory:
            raise ValueError(f"a central directory of {cd_size} bytes: more than max_metadata={self.max_directory}")
        if cd_start >= tail_start:
            cd = tail[cd_start - tail_start:cd_start - tail_start + cd_size]
        else:
            head = await self.inner.read(self.key, cd_start, min(cd_size, tail_start - cd_start), expect=version)
            cd = (head or b"") + tail[:max(0, cd_start + cd_size - tail_start)]
        if len(cd) != cd_size:
            raise ValueError(f"the central directory ({cd_size} bytes at {cd_start}) is cut short")
        d = parse_directory(cd, cd_start, version, self.max_directory)
        self._root = (d.modes()[1], version.uid, version.gid)
        if self._seen is _UNSEEN:
            self._seen = _state(version)
        d.tail, d.tail_start = tail, tail_start  # (entries in it are read from it: a small archive costs one request)
        if d.skipped and first_time(f"{self.display}: skipped {d.skipped[0]}"):
            log.warning("%s: entries not shown (names that are not relative paths): %s", self.display,
                        ", ".join(map(repr, d.skipped)))
        return d

    async def _bytes(self, d: Directory, start: int, length: int, extent: int | None = None) -> bytes:
        """Bytes of the archive `d` was read from (from its tail where they are in it)."""
        t = start - d.tail_start
        if t >= 0 and t + length <= len(d.tail):
            return d.tail[t:t + length]
        data = await self.inner.read(self.key, start, length, extent=extent, expect=d.version)
        if data is None or len(data) != length:
            raise ShardChanged(self.key, "cut short while mounted")
        return data

    def _forget(self, d: Directory) -> None:
        if self._dir is d:
            self._dir = None

    def forget_versions(self) -> None:
        """`zvfs refresh`: the end records are read again at the next use. (A remote archive's
        version is learnt from reads only: a small archive, read whole with its end records,
        was never asked for again, and a replaced one kept showing its old entries.)"""
        self._dir = None

    # -- entries

    def _failed(self, key: str, problem: str, corrupt: bool = True) -> ZvfsError:
        where = f"{self.display}/{key}"
        if not corrupt:
            return StorageError(f"{where}: {problem}")  # (logged once by the fronts)
        if first_time(f"{where}: {problem}"):
            log.error("%s: %s", where, problem)
        return CorruptShardError(where, problem)

    async def _locate(self, d: Directory, i: int, key: str, whole: bool) -> tuple[int, bytes | None]:
        """The entry's data offset (its local header read once), and its bytes when `whole`
        and they came with the header."""
        if d.data[i] >= 0:
            return d.data[i], None
        lho, csize, limit = d.lho[i], d.csize[i], d.limit[i]
        name = d.stored_name(i)
        want = LOC.size + len(name) + SLACK + (csize if whole else 0)
        head = await self._bytes(d, lho, min(want, limit - lho))
        if len(head) < LOC.size + len(name) or head[:4] != SIG_LOC:
            raise self._failed(key, f"no local header at {lho}")
        nlen, elen = LOC.unpack_from(head)[-2:]
        if head[LOC.size:LOC.size + nlen] != name:
            raise self._failed(key, "the local header names another entry")
        off = lho + LOC.size + nlen + elen
        if off + csize > limit:
            raise self._failed(key, f"{csize} bytes at {off} reach past {limit}")
        d.data[i] = off
        if whole and len(head) >= off - lho + csize:
            return off, head[off - lho:off - lho + csize]
        return off, None

    async def _entry(self, d: Directory, i: int, key: str, start: int, length: int | None, extent: int | None) -> bytes:
        if i in d.problems:
            raise self._failed(key, *d.problems[i])
        size = d.usize[i]
        if start < 0:
            start = max(0, size + start)
            end = size
        else:
            start = min(start, size)
            end = size if length is None else min(size, start + length)
        if end <= start:
            return b""
        if d.method[i] == DEFLATED:
            data = await self.inflated.get(("zip", self.key, key, d.version.size, d.version.tag, i),
                                           lambda: self._inflate(d, i, key))
            return data[start:end]
        # An archive changed less than SETTLE ago may have been rewritten under a version that
        # does not show it (a write being copied, two writes within one timestamp tick: racy
        # writes, docs/reliability.md): its entries are read whole, their CRC-32 the proof that
        # the bytes are the entry its central directory describes.
        # (One larger than the decoded cache is EIO until the archive settles: the budget.)
        unsettled = not d.version.settled
        if unsettled and size > max(SMALL, self.inflated.max_bytes):
            raise ShardChanged(self.key, "changed in the last seconds, and the entry is too large to check whole")
        whole = size <= SMALL or unsettled
        off, data = await self._locate(d, i, key, whole)
        if data is None:
            lo, hi = (0, size) if unsettled else (start, end)
            stop = off + (hi if extent is None else max(hi, min(size, extent)))
            data = await self._bytes(d, off + lo, hi - lo, extent=stop)
            if not unsettled:
                whole, start, end = start == 0 and end == size, 0, end - start
        if whole and zlib.crc32(data) != d.crc[i]:
            if unsettled:
                raise ShardChanged(self.key, "rewritten while being read")
            raise self._failed(key, "CRC-32 mismatch")
        return data[start:end]

    async def _inflate(self, d: Directory, i: int, key: str) -> bytes:
        usize, csize = d.usize[i], d.csize[i]
        limit = self.inflated.max_bytes
        if usize > limit or csize > limit:
            raise self._failed(key, f"a deflated entry of {usize} bytes: more than the decoded cache ({limit} bytes) "
                                    "holds", corrupt=False)
        held = min(limit, usize + csize)  # (the deflated bytes and what they inflate to)
        await self._inflating.acquire(held)
        try:
            off, data = await self._locate(d, i, key, True)
            if data is None:
                data = await self._bytes(d, off, csize)
            if usize >= THREADED:
                out = await trio.to_thread.run_sync(inflate, data, usize, d.crc[i])
            else:
                out = inflate(data, usize, d.crc[i])
            del data
        finally:
            self._inflating.release(held)
        if isinstance(out, str):
            raise self._failed(key, out)
        return out

    async def _get(self, key: str, start: int, length: int | None, extent: int | None,
                   expect: Version | None) -> tuple[bytes | None, Version | None]:
        for attempt in (0, 1):
            d = await self._directory()
            i = d.find(key)
            version = None if i is None else d.version_of(i)
            if expect is not None and not expect.same(version):
                raise ShardChanged(key, "changed while mounted" if version else "deleted while mounted")
            if i is None:
                return None, None
            try:
                return await self._entry(d, i, key, start, length, extent), version
            except ShardChanged:
                self._forget(d)  # the archive changed: its new central directory is read next
                if expect is not None or attempt:
                    raise
        raise AssertionError("unreachable")

    # -- Store

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        if length == 0:
            return b""
        return (await self._get(key, start, length, extent, expect))[0]

    def read_now(self, key: str, start: int, length: int, expect: Version | None = None) -> bytes | memoryview | None:
        d = self._dir
        if d is None or not d.version.settled or start < 0 or not length:
            return None
        i = d.find(key)
        if i is None or d.method[i] != STORED or d.data[i] < 0 or i in d.problems or start + length > d.usize[i]:
            return None
        if expect is not None and not expect.same(d.version_of(i)):
            return None  # (the slow path says why)
        try:
            return self.inner.read_now(self.key, d.data[i] + start, length, expect=d.version)
        except ShardChanged:
            self._forget(d)
            return None

    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        if length == 0:
            d = await self._directory()
            i = d.find(key)
            return (None, None) if i is None else (b"", d.version_of(i))
        return await self._get(key, start, length, None, None)

    async def current(self, key: str) -> Version | None:
        d = await self._directory()
        i = d.find(key)
        return None if i is None else d.version_of(i)

    async def size(self, key: str) -> int | None:
        d = await self._directory()
        i = d.find(key)
        return None if i is None else d.usize[i]

    async def list(self, prefix: str) -> Entries | None:
        return (await self._directory()).list(prefix.strip("/"))

    def root_mode(self) -> tuple[int | None, int | None, int | None]:
        """(mode, uid, gid) of the root directory: the archive's (as `LocalStore.root_mode`),
        once its central directory was read (closed once its path names nothing: moved into a
        closed directory, say); None where unknown (remote archives)."""
        mode, uid, gid = self._root
        return (0, uid, gid) if self._gone else (mode, uid, gid)

    async def directories_changed(self) -> bool:
        """A local archive's permission watch (`LocalStore.directories_changed` for the
        directories above it, and a stat of the archive): whether a directory above it, or the
        archive's own bits, owner or identity changed, or it is gone (or back), since its
        central directory was read. Before, a mount or `zvfs serve` of an archive moved into
        a 0700 directory, or narrowed to 0600, stayed readable to others (an outside
        attacker). Nothing for remote archives (no bits)."""
        inner = self.inner
        if not isinstance(inner, LocalStore):
            return False
        changed = await inner.directories_changed()
        try:
            now = await inner.current(self.key)
        except TooManyOpen:  # (nothing known now: the next look tells)
            return changed
        except StorageError:  # (not a file the store opens now: a symlink leading outside, a FIFO)
            now = None
        # (against the last look, not the central directory: a read that meets the new
        # version reads that again first, and the change went unseen)
        seen, self._seen = self._seen, _state(now)
        self._gone = now is None
        if now is not None:  # (the bits the archive shows now, without reading it again)
            self._root = (_modes(now.mode)[1], now.uid, now.gid)
        return changed or seen != self._seen

    def forget_directories(self) -> None:
        """`zvfs refresh`: the directories above read again (the archive's bits: `forget_versions`)."""
        forget = getattr(self.inner, "forget_directories", None)
        if forget is not None:
            forget()

    async def aclose(self) -> None:
        await self.inner.aclose()


_UNSEEN = object()


def _modes(mode: int | None) -> tuple[int | None, int | None]:
    """(files' bits, directories' bits) an archive of (reader's) bits `mode` shows: its read
    bits, and search bits where they are readable; None where unknown."""
    if mode is None:
        return None, None
    read = mode & 0o444
    return read, read | (read >> 2)


def _state(v: Version | None) -> tuple | None:
    """What the permission watch compares of an archive: its identity, times, size and bits."""
    return None if v is None else (v.tag, v.size, v.mode, v.uid, v.gid)


async def zip_headed(store: Store) -> bool:
    """Whether the store's root object begins as a zip archive does (a local header, or the end
    record of an empty archive); False where it cannot be read."""
    try:
        return await store.read("", 0, 4) in (SIG_LOC, SIG_EOCD)
    except ZvfsError:
        return False


def zip_named(source: str) -> bool:
    """A URL whose name says it is a zip archive (an `.ozx`, a `.zip`; with a final `/`, a
    directory of that name)."""
    return source.split("?", 1)[0].lower().endswith((".zip", ".ozx"))
