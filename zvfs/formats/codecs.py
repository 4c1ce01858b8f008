"""Zarr v3 codec chains in the terms other formats use, and chunk decoding where bytes cannot
simply pass through (N5 transcoding, ZVF objects).

A chain is the codec list of an (unsharded, or innermost) chunk. It is parsed and decoded by
zarr-python's own codec objects (its registry: the standard codecs and every registered
extension, `numcodecs.*` included), so any chain zarr can decode is decodable here. What
zarr does not give is a bound on what a decoder may allocate: a 48 KiB zstd frame can
declare (or, without a declared size, inflate to) 1 GiB. So every bytes->bytes stage is held
to the size the metadata implies (the chunk's shape x item size, plus the fixed overhead of
checksum codecs) BEFORE the output is allocated where the format says it (zstd frame content
size, blosc header nbytes), by a streaming decoder with a maximum output (gzip), or by a
destination buffer of the exact size (zstd frames without a declared size). Other registered
bytes->bytes codecs are checked after decoding. Variable-length chunks (vlen-bytes/-utf8) have no
size in the metadata: they may decode to at most `VLEN_MAX`.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import warnings
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import trio

if TYPE_CHECKING:
    import numcodecs
# zarr, numcodecs and asyncio are imported where a chain first needs them, like zarr: together
# 120 ms of every process start (every mount starts two), for stores that never transcode

BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
#: bytes->bytes codecs whose bytes other formats can carry unchanged (one compressor)
COMPRESSORS = ("gzip", "zstd", "blosc")
#: array->bytes codecs of variable-length values (Zarr v2 has them as filters of "|O" arrays)
VLEN = ("vlen-bytes", "vlen-utf8")

#: Decoded size cap of a variable-length (vlen-bytes, vlen-utf8) chunk: the default memory budget (256M)
#: leaves a 40 MiB decoded-data cache; one chunk must fit in it. ZVF cells written by
#: zarr-vectors with its default chunking hold well under 1 MiB.
VLEN_MAX = 32 * 2**20
#: What a bytes->bytes stage may add to the decoded size of the stage below it: checksums add
#: 4-8 bytes, compressors at most ~0.4% + a frame header on incompressible data (zstd, blosc
#: add 16 bytes, gzip 5 bytes per 16 KiB block + 18).
SLACK_FIXED = 64 * 1024
SLACK_RATIO = 16


#: stored chunks from this size on are decoded in a worker thread: decoding runs at about
#: 1-5 ms per MiB produced (gzip, zstd, compressed_segmentation, jpeg, png), which on the
#: event loop would hold up every other request of the mount; below it the thread hop
#: (~60 µs) costs more than the decode
DECODE_IN_THREAD = 16 * 1024


_DECODERS: trio.lowlevel.RunVar = trio.lowlevel.RunVar("zvfs_decoders")


async def decode_step(fn: Callable[..., Any], data: bytes, *args: Any) -> Any:
    """`fn(data, *args)`: a decode (or transcode) step, in a worker thread when `data` is
    large. zlib, zstd, blosc and imagecodecs release the GIL while they work, so the event loop
    goes on answering the kernel meanwhile, and two chunks decode on two cores
    (compressed-segmentation 2.3.3 does not: measured in docs/benchmarks.md). At most one
    thread per core decodes at a time: more would not be faster, and every decode in flight
    holds its output outside the decoded-data budget."""
    if len(data) < DECODE_IN_THREAD:
        return fn(data, *args)
    try:
        limiter = _DECODERS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(os.cpu_count() or 2)
        _DECODERS.set(limiter)
    return await trio.to_thread.run_sync(functools.partial(fn, data, *args), limiter=limiter)


class DecodeError(ValueError):
    """A chunk whose bytes do not decode, or would decode to more than its metadata allows."""


def name_of(codec) -> str:
    return codec if isinstance(codec, str) else codec.get("name", "")


def config_of(codec) -> dict:
    return (codec.get("configuration") or {}) if isinstance(codec, dict) else {}


def _zarr_chain(codecs: list, data_type, ndim: int):
    """zarr's codec objects for the chain (validated and evolved for the data type), or None
    when zarr cannot build them (an unknown codec, a wrong order, a bad configuration)."""
    from zarr.core.codec_pipeline import codecs_from_list
    from zarr.core.dtype import get_data_type_from_json
    from zarr.core.metadata.v3 import ArrayV3Metadata

    try:
        zdtype = get_data_type_from_json(data_type, zarr_format=3)
        meta = {"zarr_format": 3, "node_type": "array", "shape": [1] * ndim, "data_type": data_type,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1] * ndim}},
                "chunk_key_encoding": {"name": "default"}, "codecs": codecs,
                "fill_value": zdtype.to_json_scalar(zdtype.default_scalar(), zarr_format=3)}
        with warnings.catch_warnings():  # "numcodecs.* codecs are not in the spec": known, fine
            warnings.simplefilter("ignore")
            parsed = ArrayV3Metadata.from_dict(meta)
        return parsed.dtype, codecs_from_list(parsed.codecs)
    except Exception:  # noqa: BLE001 - zarr raises many kinds for codecs it does not accept
        return None


@dataclass(frozen=True)
class Chain:
    """A codec chain taken apart: the array->array codecs (`order`: the permutation when they
    are a single transpose, else None), the array->bytes codec and its byte order, and the
    bytes->bytes codecs; plus zarr's codec objects that decode it."""

    order: tuple[int, ...] | None
    array_codecs: tuple
    serializer: str
    endian: str  # "<", ">" or "|" (one-byte values, vlen, or a serializer other than bytes)
    compressors: tuple
    _zdtype: object = field(compare=False, repr=False)
    _codecs: tuple = field(compare=False, repr=False)

    @classmethod
    def parse(cls, codecs: list, data_type, ndim: int) -> "Chain | None":
        """None when zarr cannot decode the chain."""
        if not isinstance(codecs, list) or any(name_of(c) == "sharding_indexed" for c in codecs):
            return None
        built = _zarr_chain(codecs, data_type, ndim)
        if built is None:
            return None
        zdtype, (aa, ab, bb) = built
        array_codecs, serializer, compressors = tuple(codecs[:len(aa)]), name_of(codecs[len(aa)]), tuple(codecs[len(aa) + 1:])
        order = None
        if len(array_codecs) == 1 and name_of(array_codecs[0]) == "transpose":
            order = tuple(int(a) for a in aa[0].order)
        endian = "|"
        if serializer == "bytes" and zdtype.to_native_dtype().itemsize > 1:
            endian = "<" if config_of(codecs[len(aa)]).get("endian", "little") == "little" else ">"
        return cls(order, array_codecs, serializer, endian, compressors, zdtype, (aa, ab, bb))

    @property
    def plain(self) -> bool:
        """Bytes in the chunk are the values themselves (bytes, vlen-bytes, vlen-utf8),
        possibly after a transpose: the only form other formats can take unchanged."""
        return self.serializer in ("bytes", *VLEN) and (not self.array_codecs or self.order is not None)

    def dtype(self, data_type=None) -> np.dtype:
        """The NumPy dtype of the chunk's values as stored (byte order of the bytes codec)."""
        if self.serializer in VLEN:
            return np.dtype(object)
        dt = self._zdtype.to_native_dtype()
        return dt if self.endian == "|" else dt.newbyteorder(self.endian)

    def decode(self, raw: bytes, data_type, chunk_shape: tuple[int, ...]) -> np.ndarray:
        """The chunk as an array in array axis order (object array for vlen-bytes/-utf8). Raises
        DecodeError for bytes that do not decode or would decode past the chunk's size."""
        from zarr.core.array_spec import ArrayConfig, ArraySpec
        from zarr.core.buffer import default_buffer_prototype

        aa, ab, bb = self._codecs
        proto = default_buffer_prototype()
        spec = ArraySpec(tuple(chunk_shape), self._zdtype, self._zdtype.default_scalar(), ArrayConfig("C", False), proto)
        try:
            aa_specs = []
            for c in aa:
                aa_specs.append(spec)
                spec = c.resolve_metadata(spec)
            bytes_spec = ab.resolve_metadata(spec)
            native = self._zdtype.to_native_dtype()
            fixed = native.kind not in "OTSU" or self.serializer == "bytes"
            nbytes = math.prod(spec.shape) * native.itemsize if fixed else None
            limit = nbytes + nbytes // SLACK_RATIO + SLACK_FIXED if nbytes is not None else VLEN_MAX
            exact = []  # per bytes->bytes codec, the exact size its decoder must produce, if fixed
            n = ab.compute_encoded_size(nbytes, spec) if nbytes is not None and getattr(ab, "is_fixed_size", False) else None
            for c in bb:
                exact.append(n)
                n = c.compute_encoded_size(n, bytes_spec) if n is not None and getattr(c, "is_fixed_size", False) else None
            buf = proto.buffer.from_bytes(raw if isinstance(raw, bytes) else bytes(raw))
            for c, j, size in reversed(list(zip(bb, self.compressors, exact))):
                buf = _decode_bytes(c, name_of(j), buf, bytes_spec, size, limit)
            if nbytes is not None and self.serializer == "bytes" and len(buf) != nbytes:
                raise DecodeError(f"chunk holds {len(buf)} bytes, its shape needs {nbytes}")
            arr = _run(ab, buf, spec)
            for c, s in reversed(list(zip(aa, aa_specs))):
                arr = _run(c, arr, s)
            return arr.as_numpy_array()
        except DecodeError:
            raise
        except Exception as e:  # noqa: BLE001 - a decoder's failure on bad bytes, whatever its kind
            raise DecodeError(f"{type(e).__name__}: {e}") from None


def _zdtype(data_type):
    from zarr.core.dtype import get_data_type_from_json

    return get_data_type_from_json(data_type, zarr_format=3)


def fill_value(data_type, fill):
    """The fill value of a Zarr v3 array as a NumPy scalar, from its JSON form (any form the
    v3 spec allows: "NaN", hex floats, [re, im], base64 bytes; bare NaN tokens too)."""
    return _zdtype(data_type).from_json_scalar(fill, zarr_format=3)


def fill_value_json(data_type, fill, zarr_format: int):
    """The fill value written the way the given Zarr spec wants it for the data type: bool as
    true/false, non-finite floats as "NaN"/"Infinity"/"-Infinity" strings, complex as a pair,
    fixed-length bytes as base64 (zarr-python's own encoders for each format). Raises
    ValueError when the fill value is not valid for the data type."""
    zdtype = _zdtype(data_type)
    return zdtype.to_json_scalar(zdtype.from_json_scalar(fill, zarr_format=3), zarr_format=zarr_format)


def _run(codec, data, spec):
    """One zarr codec's decode: its synchronous form where it has one (the standard codecs),
    else its coroutine on a private asyncio loop (zarr's numcodecs.* wrappers)."""
    if hasattr(codec, "_decode_sync"):
        return codec._decode_sync(data, spec)
    import asyncio

    return asyncio.run(codec._decode_single(data, spec))


def _decode_bytes(codec, name: str, buf, spec, exact: int | None, limit: int):
    """One bytes->bytes stage, never producing more than `exact` (when the metadata fixes the
    size) or `limit` bytes."""
    bound = exact if exact is not None else limit
    data = buf.as_numpy_array()
    if name == "gzip":
        out = gunzip_bounded(data.tobytes(), bound)
    elif name == "zstd":
        declared = zstd_content_size(data)
        if declared is not None and declared > bound:
            raise DecodeError(f"zstd frame declares {declared} bytes, the chunk allows {bound}")
        size = exact if exact is not None else declared
        if size is None:
            raise DecodeError("zstd frame without a content size where the chunk's size is not fixed")
        from numcodecs import Zstd

        out = Zstd().decode(data, out=np.empty(size, np.uint8))  # bounded by the destination
    elif name == "blosc":
        declared = blosc_nbytes(data)
        if declared > bound:
            raise DecodeError(f"blosc header declares {declared} bytes, the chunk allows {bound}")
        return _run(codec, buf, spec)
    else:
        result = _run(codec, buf, spec)
        if len(result) > bound:
            raise DecodeError(f"{name} decoded to {len(result)} bytes, the chunk allows {bound}")
        return result
    if exact is not None and len(out) != exact:
        raise DecodeError(f"{name} decoded to {len(out)} bytes, the chunk needs {exact}")
    return buf.from_array_like(np.frombuffer(out, np.uint8) if isinstance(out, (bytes, bytearray)) else out)


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """gzip members (one or more, concatenated) decoded to at most `limit` bytes."""
    out = bytearray()
    rest = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += d.decompress(rest, limit + 1 - len(out))
        except zlib.error as e:
            raise DecodeError(f"gzip: {e}") from None
        if len(out) > limit or d.unconsumed_tail:
            raise DecodeError(f"gzip data inflates past the {limit} bytes the chunk allows")
        if not d.eof:
            raise DecodeError("gzip data is truncated")
        rest = d.unused_data
        if not rest:
            return bytes(out)


def zstd_content_size(data) -> int | None:
    """The decoded size a zstd frame header declares (RFC 8878 3.1.1.1), None if it does not."""
    b = memoryview(np.ascontiguousarray(data).view(np.uint8))
    if len(b) < 5 or bytes(b[:4]) != b"\x28\xb5\x2f\xfd":
        raise DecodeError("not a zstd frame")
    fhd = b[4]
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        return None
    if len(b) < pos + width:
        raise DecodeError("zstd frame header is truncated")
    value = int.from_bytes(bytes(b[pos:pos + width]), "little")
    return value + 256 if width == 2 else value


def blosc_nbytes(data) -> int:
    """The decoded size a blosc (1.x) header declares."""
    b = np.ascontiguousarray(data).view(np.uint8)
    if len(b) < 16:
        raise DecodeError("blosc header is truncated")
    nbytes, _blocksize, cbytes = struct.unpack_from("<III", b.tobytes()[:16], 4)
    if cbytes != len(b):
        raise DecodeError(f"blosc header says {cbytes} compressed bytes, the chunk has {len(b)}")
    return nbytes


def compressor(codec) -> numcodecs.abc.Codec:
    """numcodecs object for a v3 bytes->bytes codec, with its settings (for encoding)."""
    import numcodecs

    name, conf = name_of(codec), config_of(codec)
    if name == "gzip":
        return numcodecs.GZip(level=conf.get("level", 5))
    if name == "zstd":
        return numcodecs.Zstd(level=conf.get("level", 0), checksum=conf.get("checksum", False))
    if name == "blosc":
        shuffle = conf.get("shuffle", "noshuffle")
        return numcodecs.Blosc(cname=conf.get("cname", "lz4"), clevel=conf.get("clevel", 5),
                               shuffle=BLOSC_SHUFFLE.get(shuffle, shuffle), blocksize=conf.get("blocksize", 0))
    raise ValueError(f"unknown bytes->bytes codec {name!r}")
