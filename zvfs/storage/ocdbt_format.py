"""Decoding of tensorstore's OCDBT format: manifest, version tree nodes, B+tree nodes.

Written from the format's documentation (tensorstore/kvstore/ocdbt/index.rst, "Storage format")
and checked against tensorstore's decoder (kvstore/ocdbt/format/*.cc) where the page is vague:
`manifest_kind`, `value_kind` and heights are single bytes; commit times are uint64le
nanoseconds in leaf and interior entries alike; the CRC-32C covers every byte before it
(header included). Every node is decoded whole into flat columns (one bytes object of keys,
numpy arrays of numbers, varint columns decoded with numpy), never one Python object per
entry: a leaf of 100,000 entries written by tensorstore (keys `arr/c/I/J`, half the values
inline) decodes in 0.13 s into 5.6 MB held, 56 bytes an entry, which its `nbytes` gives
within 0.1% (so a cache can budget it); a list of its keys as bytes objects alone took 47
bytes an entry, and decoding varint by varint in Python took 0.77 s.

Nothing here trusts a length: every count and size is checked against the bytes that remain,
the decompressed size against a limit given by the caller, the keys a node rebuilds (prefix
compression can make a few bytes stand for 64 KiB each) against a multiple of its size. A
violation is `FormatError`, which the store turns into EIO for the keys below that node.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import crc32c
import numpy as np

MANIFEST_MAGIC = 0x0CDB3A2A
VERSION_NODE_MAGIC = 0x0CDB1234
BTREE_NODE_MAGIC = 0x0CDB20DE
#: tensorstore's own limits (format/btree_codec.h, key.h, data_file_id.h)
MAX_NODE_ARITY = 1 << 20
MAX_KEY_LENGTH = 65535
MAX_PATH_LENGTH = 65535
MAX_ARITY_LOG2 = 16
#: rebuilt key bytes per decoded byte (plus 1 MiB) a node may hold: a real node's keys share
#: the node's common prefix (stripped) and add a few bytes each (tensorstore's chunk keys
#: `c/1/2/3`: ~3 key bytes per ~6-byte entry)
KEY_BLOWUP = 16
#: bytes a decoded node holds per entry besides its keys: the key ends and five numpy columns
#: (files, offsets, lengths, common, value_ends), 8 bytes each (`nbytes`)
HELD_PER_ENTRY = 48
MISSING = (1 << 64) - 1  # offset and length of an absent B+tree root (an empty database)


class FormatError(ValueError):
    """Bytes that are not a valid OCDBT manifest or node (one line)."""


class TooLarge(FormatError):
    """A node larger, decompressed or decoded, than the caller's limit allows."""


@dataclass(frozen=True, slots=True)
class Ref:
    """Where an encoded node or a value lies: `path` relative to the database root; `base` the
    transitive path the node's own data file table is relative to."""

    path: str
    offset: int
    length: int
    base: str = ""


@dataclass(frozen=True, slots=True)
class Generation:
    """One version of the database: a B+tree root (None: empty) and when it was committed."""

    number: int
    root: Ref | None
    height: int
    commit_ns: int


@dataclass(frozen=True, slots=True)
class VersionNodeRef:
    """An interior entry of the version tree: the node holding generations up to `last`, of
    which the earliest was committed at `earliest_ns`."""

    last: int
    ref: Ref
    count: int
    earliest_ns: int
    height: int


@dataclass(frozen=True, slots=True)
class Config:
    uuid: bytes
    manifest_kind: int  # 0 single (versions inline), 1 numbered (manifest.%016x files)
    max_inline_value_bytes: int
    max_decoded_node_bytes: int
    arity_log2: int
    compression: str  # "none" | "zstd"


@dataclass(frozen=True, slots=True)
class Manifest:
    config: Config
    versions: tuple[Generation, ...]  # the latest ones, oldest first
    version_nodes: tuple[VersionNodeRef, ...]  # older ones, by height (highest first)


@dataclass(frozen=True, slots=True)
class VersionNode:
    height: int
    leaves: tuple[Generation, ...]  # height 0
    children: tuple[VersionNodeRef, ...]  # height > 0

    @property
    def nbytes(self) -> int:
        return 200 * (len(self.leaves) + len(self.children)) + 200


class _Reader:
    """A cursor over decoded bytes; every read checks what remains."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise FormatError("ends early")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self, limit: int = MISSING) -> int:
        value = shift = 0
        data, pos = self.data, self.pos
        while True:
            if pos >= len(data) or shift > 63:
                raise FormatError("ends early" if pos >= len(data) else "varint longer than 64 bits")
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        self.pos = pos
        if value >> 64:
            raise FormatError("varint longer than 64 bits")
        if value > limit:
            raise FormatError(f"value {value} over its limit {limit}")
        return value

    def varints(self, k: int, limit: int = MISSING) -> np.ndarray:
        """k varints in a row (a column), as uint64: found with numpy (one Python `varint`
        call per value took 60% of decoding a 100,000-entry leaf: 0.46 of 0.77 s)."""
        if k == 0:
            return np.zeros(0, np.uint64)
        view = np.frombuffer(self.data, np.uint8, count=min(self.remaining(), 10 * k), offset=self.pos)
        ends = np.flatnonzero(view < 0x80)[:k]
        if len(ends) < k:
            raise FormatError("ends early")
        starts = np.empty(k, np.int64)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        sizes = ends - starts + 1
        longest = int(sizes.max())
        if longest > 10:
            raise FormatError("varint longer than 64 bits")
        values = np.zeros(k, np.uint64)
        for j in range(longest):
            sel = sizes > j
            byte = view[starts[sel] + j].astype(np.uint64) & np.uint64(0x7F)
            if j == 9 and (byte > 1).any():
                raise FormatError("varint longer than 64 bits")
            values[sel] |= byte << np.uint64(7 * j)
        if limit < MISSING and (values > np.uint64(limit)).any():
            raise FormatError(f"value {int(values.max())} over its limit {limit}")
        self.pos += int(ends[-1]) + 1
        return values

    def count(self, limit: int, each: int = 1) -> int:
        """A count of things that take at least `each` bytes each: no more than remain."""
        n = self.varint(limit)
        if n * each > self.remaining():
            raise FormatError(f"count {n} larger than the bytes that remain")
        return n

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            raise FormatError("ends early")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def le(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise FormatError(f"{len(self.data) - self.pos} bytes after the end")


def unwrap(encoded: bytes, magic: int, max_decoded: int) -> bytes:
    """The body of an encoded manifest or node: header (magic uint32be, length uint64le,
    version varint, compression varint), body (zstd or plain), CRC-32C (uint32le) of all before
    it. The decompressed body may not exceed `max_decoded` bytes: a zstd body is refused
    unread when its frame declares more, else as it inflates past it."""
    if len(encoded) < 16:
        raise FormatError(f"{len(encoded)} bytes: shorter than a header")
    found = int.from_bytes(encoded[:4], "big")
    if found != magic:
        raise FormatError(f"magic {found:#010x}, expected {magic:#010x}")
    length = int.from_bytes(encoded[4:12], "little")
    if length != len(encoded):
        raise FormatError(f"header says {length} bytes, read {len(encoded)}")
    stored = int.from_bytes(encoded[-4:], "little")
    if crc32c.crc32c(encoded[:-4]) != stored:
        raise FormatError("CRC-32C checksum mismatch")
    r = _Reader(encoded[:-4])
    r.pos = 12
    version = r.varint()
    if version != 0:
        raise FormatError(f"format version {version} (only 0 is known)")
    compression = r.varint()
    body = encoded[r.pos:-4]
    if compression == 0:
        if len(body) > max_decoded:
            raise TooLarge(f"{len(body)} bytes, over the limit of {max_decoded}")
        return body
    if compression == 1:
        return _unzstd(body, max_decoded)
    raise FormatError(f"unknown compression format {compression}")


def _unzstd(body: bytes, limit: int) -> bytes:
    """zstd frames, decompressed up to `limit` bytes (more is an error, found after at most
    1 MiB past it: the frame's own content size is not trusted)."""
    import zstandard

    out = bytearray()
    try:
        declared = zstandard.frame_content_size(body)
        if declared > limit:  # (-1: not declared)
            raise TooLarge(f"declares {declared} bytes decompressed, over the limit of {limit}")
        with zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True) as reader:
            while True:
                piece = reader.read(min(1 << 20, limit + 1 - len(out)))
                if not piece:
                    break
                out += piece
                if len(out) > limit:
                    raise TooLarge(f"decompresses to over the limit of {limit} bytes")
    except zstandard.ZstdError as e:
        raise FormatError(f"zstd: {e}") from None
    return bytes(out)


def _data_file_table(r: _Reader, transitive: str) -> list[tuple[str, str]]:
    """The data file table: (full path, transitive path for nodes read from it) per file. A
    path that is empty or leaves the database is kept as "" (tensorstore lists an empty path
    for the absent root of generation 1): referring to it is the error."""
    n = r.count(MAX_NODE_ARITY)
    prefix = [0] + [r.varint(MAX_PATH_LENGTH) for _ in range(max(0, n - 1))]
    suffix = [r.varint(MAX_PATH_LENGTH) for _ in range(n)]
    base = [r.varint(MAX_PATH_LENGTH) for _ in range(n)]
    if sum(suffix) > r.remaining():
        raise FormatError("data file table longer than its node")
    out: list[tuple[str, str]] = []
    prev = b""
    for i in range(n):
        if prefix[i] > len(prev):
            raise FormatError(f"data file {i}: common prefix longer than the path before it")
        path = prev[:prefix[i]] + r.take(suffix[i])
        if base[i] > len(path) or len(transitive) + len(path) > MAX_PATH_LENGTH:
            raise FormatError(f"data file {i}: base path or path too long")
        try:
            text = path.decode()
        except UnicodeDecodeError:
            raise FormatError(f"data file {i}: path is not UTF-8") from None
        full = transitive + text
        if full.startswith("/") or any(part in ("", ".", "..") for part in full.split("/")):
            full = ""
        out.append((full, transitive + path[:base[i]].decode(errors="replace")))
        prev = path
    return out


def _columns(r: _Reader, n: int, files: list[tuple[str, str]], allow_missing: bool = False) -> tuple[np.ndarray, ...]:
    """n indirect data references as columns: file ids, offsets, lengths (`allow_missing`: an
    offset and length of 2^64-1 each stands for no node, its id unchecked)."""
    ids, offsets, lengths = r.varints(n), r.varints(n), r.varints(n)
    used = ~((offsets == np.uint64(MISSING)) & (lengths == np.uint64(MISSING))) if allow_missing else np.ones(n, bool)
    if (ids[used] >= np.uint64(len(files))).any():
        raise FormatError(f"data file id outside the table of {len(files)}")
    outside = np.array([not path for path, _ in files] or [True])
    if outside[ids[used].astype(np.int64)].any():
        raise FormatError("a data file path outside the database")
    big = np.uint64(1 << 63)
    if ((offsets[used] >= big) | (lengths[used] >= big) | (offsets[used] + lengths[used] >= big)).any():
        raise FormatError("data reference past any file's end")
    return ids, offsets, lengths


def _refs(r: _Reader, files: list[tuple[str, str]], n: int, allow_missing: bool = False) -> list[Ref | None]:
    ids, offsets, lengths = (column.tolist() for column in _columns(r, n, files, allow_missing))
    return [None if o == MISSING and length == MISSING else Ref(files[i][0], o, length, files[i][1])
            for i, o, length in zip(ids, offsets, lengths)]


def _generations(r: _Reader, files: list[tuple[str, str]], arity_log2: int) -> tuple[Generation, ...]:
    """Version tree leaf entries (also the manifest's inline versions)."""
    n = r.count(1 << arity_log2, 4)
    if n == 0:
        raise FormatError("no versions")
    numbers = [r.varint() for _ in range(n)]
    heights = [r.byte() for _ in range(n)]
    roots = _refs(r, files, n, allow_missing=True)
    for _ in range(3 * n):  # statistics: num_keys, num_tree_bytes, num_indirect_value_bytes
        r.varint()
    times = [r.le(8) for _ in range(n)]
    if numbers[0] == 0 or any(b <= a for a, b in zip(numbers, numbers[1:])):
        raise FormatError("generation numbers not increasing from 1")
    if n > (numbers[-1] - 1) % (1 << arity_log2) + 1:
        raise FormatError(f"{n} versions in one leaf of arity 2^{arity_log2}")
    return tuple(Generation(g, root, h, t) for g, root, h, t in zip(numbers, roots, heights, times))


def _version_children(r: _Reader, files: list[tuple[str, str]], limit: int, height: int | None) -> tuple[VersionNodeRef, ...]:
    """Interior version tree entries; `height` None: the manifest's, each with its height."""
    n = r.count(limit, 4)
    numbers = [r.varint() for _ in range(n)]
    refs = _refs(r, files, n)
    counts = [r.varint() for _ in range(n)]
    times = [r.le(8) for _ in range(n)]
    heights = [r.byte() for _ in range(n)] if height is None else [height - 1] * n
    if any(g == 0 for g in numbers) or any(b <= a for a, b in zip(numbers, numbers[1:])):
        raise FormatError("version node generation numbers not increasing from 1")
    return tuple(VersionNodeRef(g, ref, c, t, h) for g, ref, c, t, h in zip(numbers, refs, counts, times, heights))  # type: ignore[arg-type]


def _config(r: _Reader) -> Config:
    uuid = r.take(16)
    kind = r.varint(1)
    inline = r.varint(1 << 32)
    decoded = r.varint(1 << 32)
    arity = r.byte()
    if not 1 <= arity <= MAX_ARITY_LOG2:
        raise FormatError(f"version_tree_arity_log2 {arity} outside [1, {MAX_ARITY_LOG2}]")
    method = r.varint()
    if method == 1:
        r.take(4)  # zstd level (for writers)
    elif method != 0:
        raise FormatError(f"unknown compression method {method}")
    return Config(uuid, kind, inline, decoded, arity, "zstd" if method else "none")


def decode_manifest(encoded: bytes, limit: int) -> Manifest:
    r = _Reader(unwrap(encoded, MANIFEST_MAGIC, limit))
    config = _config(r)
    if config.manifest_kind != 0:
        r.end()
        return Manifest(config, (), ())
    files = _data_file_table(r, "")
    versions = _generations(r, files, config.arity_log2)
    nodes = _version_children(r, files, 64 // config.arity_log2, None)
    r.end()
    if any(b.height >= a.height for a, b in zip(nodes, nodes[1:])) or any(not 1 <= n.height < 64 // config.arity_log2 for n in nodes):
        raise FormatError("manifest version node heights not decreasing")
    return Manifest(config, versions, nodes)


def decode_version_node(encoded: bytes, base: str, arity_log2: int, limit: int) -> VersionNode:
    r = _Reader(unwrap(encoded, VERSION_NODE_MAGIC, limit))
    if r.byte() != arity_log2:
        raise FormatError("version node arity differs from the manifest's")
    height = r.byte()
    if (height + 1) * arity_log2 >= 64:
        raise FormatError(f"version node height {height} too large")
    files = _data_file_table(r, base)
    if height == 0:
        node = VersionNode(0, _generations(r, files, arity_log2), ())
    else:
        node = VersionNode(height, (), _version_children(r, files, 1 << arity_log2, height))
    r.end()
    return node


class _Keys:
    """The keys of a node as a sequence (for bisect): slices of one bytes object."""

    __slots__ = ("blob", "ends")

    def __init__(self, blob: bytes, ends: list[int]):
        self.blob = blob
        self.ends = array("Q", ends)  # 8 bytes an entry (a list of ints: 36)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> bytes:
        return self.blob[self.ends[i - 1] if i else 0:self.ends[i]]


class BtreeNode:
    """A decoded B+tree node. `prefix`: what every key of the node starts with (after the
    prefix its parent gave it); `keys[i]`: the rest of entry i's key.

    Leaf (height 0): entry i's value is `size(i)` bytes, inline (`location(i)` None) or at
    `location(i)` of a data file. Interior: entry i is the child node `ref(i)`, whose keys all
    start with prefix + `subtree(i)` (its own keys are relative to that)."""

    __slots__ = ("height", "prefix", "keys", "files", "table", "offsets", "lengths", "common", "values", "value_ends", "nbytes")

    def find(self, key: bytes) -> int:
        """Leaf: the index of `key` (relative to `prefix`), or -1."""
        i = bisect_left(self.keys, key)
        return i if i < len(self.keys) and self.keys[i] == key else -1

    def child(self, key: bytes) -> int:
        """Interior: the index of the child whose range holds `key`, or -1."""
        return bisect_right(self.keys, key) - 1

    def subtree(self, i: int) -> bytes:
        return self.keys[i][:int(self.common[i])]

    def ref(self, i: int) -> Ref:
        path, base = self.table[int(self.files[i])]
        return Ref(path, int(self.offsets[i]), int(self.lengths[i]), base)

    def size(self, i: int) -> int:
        return int(self.lengths[i])

    def location(self, i: int) -> tuple[str, int] | None:
        """Leaf: (data file, offset) of entry i's value, None when it is inline."""
        f = int(self.files[i])
        return None if f < 0 else (self.table[f][0], int(self.offsets[i]))

    def inline(self, i: int) -> bytes:
        end = int(self.value_ends[i])
        return self.values[end - int(self.lengths[i]):end]


def decode_btree_node(encoded: bytes, base: str, limit: int) -> BtreeNode:
    body = unwrap(encoded, BTREE_NODE_MAGIC, limit)
    r = _Reader(body)
    node = BtreeNode()
    node.height = r.byte()
    node.table = table = _data_file_table(r, base)
    n = r.varint(MAX_NODE_ARITY)
    if n == 0:
        raise FormatError("empty B+tree node")
    if 3 * n > r.remaining():
        raise FormatError(f"{n} entries, more than its bytes can hold")
    prefix_len = np.zeros(n, np.int64)
    prefix_len[1:] = r.varints(n - 1, MAX_KEY_LENGTH)
    suffix_len = r.varints(n, MAX_KEY_LENGTH).astype(np.int64)
    common = r.varints(n, MAX_KEY_LENGTH).astype(np.int64) if node.height else np.zeros(0, np.int64)
    key_len = prefix_len + suffix_len
    if (prefix_len[1:] > key_len[:-1]).any():
        raise FormatError("a key prefix longer than the key before it")
    if (key_len > MAX_KEY_LENGTH).any() or (node.height and (common > key_len).any()):
        raise FormatError("a key length out of range")
    # the node's common prefix: the shortest shared prefix (and, interior, subtree prefix)
    shared = int(min(suffix_len[0], prefix_len[1:].min(initial=MAX_KEY_LENGTH), common.min(initial=MAX_KEY_LENGTH)))
    total = int(key_len.sum()) - n * shared
    if total > KEY_BLOWUP * len(body) + (1 << 20):
        raise FormatError(f"keys rebuild to {total} bytes, out of proportion to the node")
    if total + HELD_PER_ENTRY * n > limit:  # what `nbytes` will count at least, before any of it is built
        raise TooLarge(f"{n} entries of {total} key bytes: over {limit} bytes decoded")
    if int(suffix_len.sum()) > r.remaining():
        raise FormatError("keys longer than the node")
    suffixes = r.take(int(suffix_len.sum()))
    node.prefix = suffixes[:shared]
    blob = bytearray(suffixes[shared:int(suffix_len[0])])
    ends = [len(blob)]
    last = bytes(blob)
    at = int(suffix_len[0])
    for p, q in zip((prefix_len[1:] - shared).tolist(), suffix_len[1:].tolist()):
        key = last[:p] + suffixes[at:at + q]
        at += q
        if key <= last:
            raise FormatError("keys out of order")
        blob += key
        ends.append(len(blob))
        last = key
    node.keys = _Keys(bytes(blob), ends)
    if node.height:
        node.common = common - shared
        ids, node.offsets, node.lengths = _columns(r, n, table)
        node.files = ids.astype(np.int64)
        r.varints(3 * n)  # statistics: num_keys, num_tree_bytes, num_indirect_value_bytes
        node.values, node.value_ends = b"", np.zeros(0, np.uint64)
    else:
        node.common = np.zeros(0, np.int64)
        lengths = r.varints(n)
        kinds = np.frombuffer(r.take(n), np.uint8)
        if (kinds > 1).any():
            raise FormatError("value kind other than 0 (inline) or 1 (data file)")
        indirect = np.flatnonzero(kinds)
        if len(indirect) and not table:
            raise FormatError("values in data files, and no data file table")
        ids = r.varints(len(indirect), max(0, len(table) - 1))
        offsets = r.varints(len(indirect))
        if len(indirect) and np.array([not path for path, _ in table])[ids.astype(np.int64)].any():
            raise FormatError("a value in a data file outside the database")
        big = np.uint64(1 << 63)
        if ((offsets >= big) | (lengths[indirect] >= big) | (offsets + lengths[indirect] >= big)).any():
            raise FormatError("value past any file's end")
        direct = np.where(kinds == 0, lengths, np.uint64(0))
        if (direct > np.uint64(r.remaining())).any() or int(direct.sum()) > r.remaining():
            raise FormatError("inline values longer than the node")
        node.values = r.take(int(direct.sum()))
        node.value_ends = np.cumsum(direct, dtype=np.uint64)
        node.files = np.full(n, -1, np.int64)
        node.files[indirect] = ids.astype(np.int64)
        node.offsets = np.zeros(n, np.uint64)
        node.offsets[indirect] = offsets
        node.lengths = lengths
    r.end()
    columns = (node.files, node.offsets, node.lengths, node.common, node.value_ends)
    node.nbytes = (len(node.keys.blob) + 8 * n + len(node.values) + sum(c.nbytes for c in columns)
                   + sum(100 + len(p) + len(b) for p, b in table) + 400)
    if node.nbytes > limit:
        raise TooLarge(f"{node.nbytes} bytes decoded, over the limit of {limit}")
    return node
