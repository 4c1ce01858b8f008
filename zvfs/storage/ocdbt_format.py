"""Decoding of tensorstore's OCDBT format: manifest, version tree nodes, B+tree nodes.

Written from the format's documentation (tensorstore/kvstore/ocdbt/index.rst, "Storage format")
and checked against tensorstore's decoder (kvstore/ocdbt/format/*.cc) where the page is vague:
`manifest_kind`, `value_kind` and heights are single bytes; commit times are uint64le
nanoseconds in leaf and interior entries alike; the CRC-32C covers every byte before it
(header included). Every node is decoded whole into flat columns (one bytes object of keys with
offsets, arrays of numbers), never one Python object per entry: a leaf of 100,000 entries
takes ~20 bytes an entry instead of ~250, so its `nbytes` is what a cache can budget.

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
MISSING = (1 << 64) - 1  # offset and length of an absent B+tree root (an empty database)


class FormatError(ValueError):
    """Bytes that are not a valid OCDBT manifest or node (one line)."""


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
    it. The decompressed body may not exceed `max_decoded` bytes."""
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
            raise FormatError(f"{len(body)} bytes, over the limit of {max_decoded}")
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
        with zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True) as reader:
            while True:
                piece = reader.read(min(1 << 20, limit + 1 - len(out)))
                if not piece:
                    break
                out += piece
                if len(out) > limit:
                    raise FormatError(f"decompresses to over the limit of {limit} bytes")
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


def _columns(r: _Reader, n: int, files: list[tuple[str, str]], allow_missing: bool = False) -> tuple[array, array, array]:
    """n indirect data references as columns: file ids, offsets, lengths (`allow_missing`: an
    offset and length of 2^64-1 each stands for no node, its id unchecked)."""
    ids = array("Q", (r.varint() for _ in range(n)))
    offsets = array("Q", (r.varint() for _ in range(n)))
    lengths = array("Q", (r.varint() for _ in range(n)))
    for i, o, length in zip(ids, offsets, lengths):
        if allow_missing and o == MISSING and length == MISSING:
            continue
        if i >= len(files) or not files[i][0]:
            raise FormatError(f"data file id {i}: not in the table, or a path outside the database")
        if o + length >= 1 << 63:
            raise FormatError("data reference past any file's end")
    return ids, offsets, lengths


def _refs(r: _Reader, files: list[tuple[str, str]], n: int, allow_missing: bool = False) -> list[Ref | None]:
    ids, offsets, lengths = _columns(r, n, files, allow_missing)
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

    def __init__(self, blob: bytes, ends: array):
        self.blob = blob
        self.ends = ends

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> bytes:
        return self.blob[self.ends[i - 1] if i else 0:self.ends[i]]


class BtreeNode:
    """A decoded B+tree node. `prefix`: what every key of the node starts with (after the
    prefix its parent gave it); `keys[i]`: the rest of entry i's key.

    Leaf (height 0): entry i's value is `inline[i]` bytes of `values` (when `files[i] < 0`) or
    `lengths[i]` bytes at `offsets[i]` of data file `files[i]`.
    Interior: entry i is the child node at `offsets[i]`, `lengths[i]` of `files[i]`, whose keys
    all start with prefix + keys[i][:common[i]] (its own keys are relative to that)."""

    __slots__ = ("height", "prefix", "keys", "files", "table", "offsets", "lengths", "common", "values", "value_ends", "nbytes")

    def find(self, key: bytes) -> int:
        """Leaf: the index of `key` (relative to `prefix`), or -1."""
        i = bisect_left(self.keys, key)
        return i if i < len(self.keys) and self.keys[i] == key else -1

    def child(self, key: bytes) -> int:
        """Interior: the index of the child whose range holds `key`, or -1."""
        return bisect_right(self.keys, key) - 1

    def ref(self, i: int) -> Ref:
        path, base = self.table[self.files[i]]
        return Ref(path, self.offsets[i], self.lengths[i], base)

    def inline(self, i: int) -> bytes:
        return self.values[self.value_ends[i] - self.lengths[i]:self.value_ends[i]]


def decode_btree_node(encoded: bytes, base: str, limit: int) -> BtreeNode:
    body = unwrap(encoded, BTREE_NODE_MAGIC, limit)
    r = _Reader(body)
    node = BtreeNode()
    node.height = r.byte()
    node.table = _data_file_table(r, base)
    n = r.varint(MAX_NODE_ARITY)
    if n == 0:
        raise FormatError("empty B+tree node")
    if 3 * n > r.remaining():
        raise FormatError(f"{n} entries, more than its bytes can hold")
    prefix_len = [0] + [r.varint(MAX_KEY_LENGTH) for _ in range(n - 1)]
    suffix_len = [r.varint(MAX_KEY_LENGTH) for _ in range(n)]
    common = [r.varint(MAX_KEY_LENGTH) for _ in range(n)] if node.height else []
    # the node's common prefix: the shortest shared prefix (and, interior, subtree prefix)
    shared = min([suffix_len[0], *prefix_len[1:], *common])
    total = 0
    prev = 0
    for i in range(n):
        if prefix_len[i] > prev:
            raise FormatError(f"entry {i}: key prefix longer than the key before it")
        prev = prefix_len[i] + suffix_len[i]
        if prev > MAX_KEY_LENGTH or (node.height and common[i] > prev):
            raise FormatError(f"entry {i}: key length out of range")
        total += prev - shared
    if total > KEY_BLOWUP * len(body) + (1 << 20):
        raise FormatError(f"keys rebuild to {total} bytes, out of proportion to the node")
    if sum(suffix_len) > r.remaining():
        raise FormatError("keys longer than the node")
    blob = bytearray()
    ends = array("Q")
    first = r.take(suffix_len[0])
    node.prefix = first[:shared]
    blob += first[shared:]
    ends.append(len(blob))
    last = first[shared:]
    for i in range(1, n):
        key = last[:prefix_len[i] - shared] + r.take(suffix_len[i])
        if key <= last:
            raise FormatError("keys out of order")
        blob += key
        ends.append(len(blob))
        last = key
    node.keys = _Keys(bytes(blob), ends)
    table = node.table
    if node.height:
        node.common = array("I", (c - shared for c in common))
        node.files, node.offsets, node.lengths = _columns(r, n, table)
        for _ in range(3 * n):  # statistics
            r.varint()
        node.values, node.value_ends = b"", array("Q")
    else:
        node.common = array("I")
        lengths = [r.varint() for _ in range(n)]
        kinds = [r.byte() for _ in range(n)]
        if any(k > 1 for k in kinds):
            raise FormatError("value kind other than 0 (inline) or 1 (data file)")
        indirect = [i for i in range(n) if kinds[i]]
        if indirect and not table:
            raise FormatError("values in data files, and no data file table")
        files = array("q", [-1]) * n
        offsets = array("Q", [0]) * n
        for i in indirect:
            files[i] = r.varint(len(table) - 1)
            if not table[files[i]][0]:
                raise FormatError("a value in a data file outside the database")
        for i in indirect:
            offsets[i] = r.varint()
            if offsets[i] + lengths[i] >= 1 << 63:
                raise FormatError("value past any file's end")
        direct = sum(lengths[i] for i in range(n) if not kinds[i])
        values = r.take(direct)
        value_ends = array("Q", [0]) * n
        at = 0
        for i in range(n):
            if not kinds[i]:
                at += lengths[i]
                value_ends[i] = at
        node.files, node.offsets, node.lengths = files, offsets, array("Q", lengths)
        node.values, node.value_ends = values, value_ends
    r.end()
    node.nbytes = len(node.keys.blob) + len(node.values) + 8 * 5 * n + 64 * len(table) + sum(len(p) for p, _ in table) + 300
    return node
