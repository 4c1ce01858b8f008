"""Zarr v3 codec chains in the terms other formats use, and chunk decoding where bytes cannot
simply pass through (N5 transcoding, ZVF objects).

A chain is the codec list of an (unsharded, or innermost) chunk. The standard chains (a core
numeric data type with transpose, bytes, gzip, zstd, blosc and crc32c: what zarr-python,
tensorstore and Neuroglancer write) are parsed, validated as zarr-python 3 validates them
(tests/test_codecs_standard.py holds the two to the same answers) and decoded here with
numcodecs, crc32c and NumPy, so zvfs runs beside zarr-python 2.18 (which uses the same
numcodecs) or without zarr. Any other chain (numcodecs.* or other registered extension codecs,
vlen strings, other data types) is parsed and decoded by zarr-python 3's own codec objects,
imported only then; without zarr-python 3 such an array is not shown, with a one-line reason
(`undecodable`). Measured (timeit, this module against zarr-python 3.1.6's codec objects):
a chain parsed in 4-9 us instead of 110-450 us; a 64x64 uint16 zstd chunk decoded in 43 us
instead of 82, a 128x128 uint8 blosc+crc32c one in 10 instead of 34 (gzip: zlib's time either way).

What no decoder gives is a bound on what it may allocate: a 48 KiB zstd frame can
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
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import crc32c
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
#: the Zarr v3 core data types, as NumPy types: parsed and decoded without zarr-python
CORE_TYPES = {"bool": "?", "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2",
              "uint32": "u4", "uint64": "u8", "float16": "f2", "float32": "f4", "float64": "f8", "complex64": "c8", "complex128": "c16"}
#: the codecs parsed and decoded without zarr-python, and the kind of each
STANDARD = {"transpose": "aa", "bytes": "ab", "gzip": "bb", "zstd": "bb", "blosc": "bb", "crc32c": "bb"}
BLOSC_CNAMES = ("lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib")

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


class NeedsZarr3(ValueError):
    """A data type or codec only zarr-python 3 handles, where it is not installed."""


def _zarr3():
    """zarr-python 3, imported on first need; NeedsZarr3 where zarr is older (2.18) or absent."""
    try:
        import zarr
    except ImportError:
        raise NeedsZarr3("zarr-python 3 is not installed") from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise NeedsZarr3(f"zarr-python {zarr.__version__} is installed, not 3")
    return zarr


def standard(codecs, data_type) -> bool:
    """The chain and data type are parsed and decoded here, without zarr-python."""
    return (isinstance(data_type, str) and data_type in CORE_TYPES and isinstance(codecs, list)
            and all(isinstance(c, dict) and c.get("name") in STANDARD for c in codecs))


def undecodable(codecs, data_type) -> str:
    """One line: why `Chain.parse` gave None."""
    names = [name_of(c) for c in codecs] if isinstance(codecs, list) else codecs
    if not standard(codecs, data_type):
        try:
            _zarr3()
        except NeedsZarr3 as e:
            return f"codecs {names} of data type {data_type!r} need zarr-python 3 ({e})"
    return f"codecs {names} cannot be decoded by zarr"


def _configuration(codec: dict, required: bool, keys: tuple[str, ...] | None) -> dict:
    """A standard codec's configuration; ValueError where zarr-python 3 refuses it (absent
    where required, not an object, a key the codec does not take)."""
    if "configuration" not in codec:
        if required:
            raise ValueError(f"{codec['name']} has no configuration")
        return {}
    conf = codec["configuration"]
    if not isinstance(conf, dict) or (keys is not None and not conf.keys() <= set(keys)):
        raise ValueError(f"{codec['name']}: configuration {conf!r}")
    return conf


def _int(v) -> bool:
    return isinstance(v, int)  # true and false too, as zarr-python checks


def _standard_chain(codecs: list, data_type: str, ndim: int) -> tuple[np.dtype, tuple, str]:
    """(values' NumPy type, the transpose orders, the bytes codec's endian) of a standard
    chain, validated the way zarr-python 3 validates it (ValueError where it refuses it)."""
    values = np.dtype(CORE_TYPES[data_type])
    kinds = [STANDARD[c["name"]] for c in codecs]
    if kinds.count("ab") != 1 or kinds != sorted(kinds):  # array->array, one array->bytes, bytes->bytes
        raise ValueError(f"codec order {[c['name'] for c in codecs]}")
    transposes, endian = [], "|"
    for c in codecs:
        name = c["name"]
        if name == "transpose":
            order = _configuration(c, True, ("order",)).get("order")
            if not isinstance(order, list) or not all(map(_int, order)) or sorted(order) != list(range(ndim)):
                raise ValueError(f"transpose order {order!r} for {ndim} axes")
            transposes.append(tuple(int(a) for a in order))
        elif name == "bytes":
            e = _configuration(c, False, ("endian",)).get("endian", sys.byteorder)
            if e not in ("little", "big") and (e is not None or values.itemsize > 1):
                raise ValueError(f"bytes endian {e!r}")
            if values.itemsize > 1:
                endian = "<" if e == "little" else ">"
        elif name == "gzip":
            level = _configuration(c, True, ("level",)).get("level", 5)
            if not _int(level) or level not in range(10):
                raise ValueError(f"gzip level {level!r}")
        elif name == "zstd":
            conf = _configuration(c, True, ("level", "checksum"))
            if not _int(conf.get("level", 0)) or conf.get("level", 0) >= 23 or not isinstance(conf.get("checksum", False), bool):
                raise ValueError(f"zstd configuration {conf!r}")
        elif name == "blosc":
            conf = _configuration(c, True, ("typesize", "cname", "clevel", "shuffle", "blocksize"))
            typesize = conf.get("typesize")
            if (conf.get("cname", "zstd") not in BLOSC_CNAMES or not _int(conf.get("clevel", 5))
                    or not _int(conf.get("blocksize", 0)) or (typesize is not None and not (_int(typesize) and typesize > 0))
                    or conf.get("shuffle") not in (None, *BLOSC_SHUFFLE)):
                raise ValueError(f"blosc configuration {conf!r}")
        else:  # crc32c: any configuration object, ignored
            _configuration(c, False, None)
    return values, tuple(transposes), endian


def _zarr_chain(codecs: list, data_type, ndim: int):
    """zarr's codec objects for the chain (validated and evolved for the data type), or None
    when zarr cannot build them (an unknown codec, a wrong order, a bad configuration) or
    zarr-python 3 is not installed."""
    try:
        _zarr3()
        from zarr.core.codec_pipeline import codecs_from_list
        from zarr.core.dtype import get_data_type_from_json
        from zarr.core.metadata.v3 import ArrayV3Metadata

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
    bytes->bytes codecs; plus what decodes it: for a standard chain the values' NumPy type and
    the transpose orders, else zarr's codec objects."""

    order: tuple[int, ...] | None
    array_codecs: tuple
    serializer: str
    endian: str  # "<", ">" or "|" (one-byte values, vlen, or a serializer other than bytes)
    compressors: tuple
    _values: np.dtype | None = field(compare=False, repr=False)  # standard: native byte order
    _transposes: tuple = field(compare=False, repr=False)  # standard: the transpose orders
    _zdtype: object = field(default=None, compare=False, repr=False)  # others: zarr's objects
    _codecs: tuple = field(default=(), compare=False, repr=False)

    @classmethod
    def parse(cls, codecs: list, data_type, ndim: int) -> "Chain | None":
        """None when the chain cannot be decoded (`undecodable` says why)."""
        if not isinstance(codecs, list) or any(name_of(c) == "sharding_indexed" for c in codecs):
            return None
        return cls._standard(codecs, data_type, ndim) if standard(codecs, data_type) else cls._zarr(codecs, data_type, ndim)

    @classmethod
    def _standard(cls, codecs: list, data_type: str, ndim: int) -> "Chain | None":
        try:
            values, transposes, endian = _standard_chain(codecs, data_type, ndim)
        except ValueError:
            return None
        n = len(transposes)
        return cls(transposes[0] if n == 1 else None, tuple(codecs[:n]), "bytes", endian, tuple(codecs[n + 1:]),
                   values, transposes)

    @classmethod
    def _zarr(cls, codecs: list, data_type, ndim: int) -> "Chain | None":
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
        return cls(order, array_codecs, serializer, endian, compressors, None, (), zdtype, (aa, ab, bb))

    @property
    def plain(self) -> bool:
        """Bytes in the chunk are the values themselves (bytes, vlen-bytes, vlen-utf8),
        possibly after a transpose: the only form other formats can take unchanged."""
        return self.serializer in ("bytes", *VLEN) and (not self.array_codecs or self.order is not None)

    def dtype(self, data_type=None) -> np.dtype:
        """The NumPy dtype of the chunk's values as stored (byte order of the bytes codec)."""
        if self.serializer in VLEN:
            return np.dtype(object)
        dt = self._values if self._values is not None else self._zdtype.to_native_dtype()
        return dt if self.endian == "|" else dt.newbyteorder(self.endian)

    def decode(self, raw: bytes, data_type, chunk_shape: tuple[int, ...]) -> np.ndarray:
        """The chunk as an array in array axis order (object array for vlen-bytes/-utf8). Raises
        DecodeError for bytes that do not decode or would decode past the chunk's size."""
        try:
            if self._values is None:
                return self._decode_zarr(raw, chunk_shape)
            dt, shape = self.dtype(), tuple(chunk_shape)
            for order in self._transposes:
                shape = tuple(shape[i] for i in order)
            nbytes = math.prod(shape) * dt.itemsize
            limit = nbytes + nbytes // SLACK_RATIO + SLACK_FIXED
            exact, n = [], nbytes  # per bytes->bytes codec, the size its decoder must produce
            for c in self.compressors:
                exact.append(n)
                n = n + 4 if n is not None and name_of(c) == "crc32c" else None
            data = raw
            for c, size in reversed(list(zip(self.compressors, exact))):
                data = _bounded(name_of(c), data, size, limit)
            arr = np.frombuffer(data, np.uint8)
            if len(arr) != nbytes:
                raise DecodeError(f"chunk holds {len(arr)} bytes, its shape needs {nbytes}")
            arr = arr.view(dt).reshape(shape)
            for order in reversed(self._transposes):
                arr = arr.transpose(np.argsort(order))
            return arr
        except DecodeError:
            raise
        except Exception as e:  # noqa: BLE001 - a decoder's failure on bad bytes, whatever its kind
            raise DecodeError(f"{type(e).__name__}: {e}") from None

    def _decode_zarr(self, raw: bytes, chunk_shape: tuple[int, ...]) -> np.ndarray:
        """`decode` by zarr's codec objects, every bytes->bytes stage bounded."""
        from zarr.core.array_spec import ArrayConfig, ArraySpec
        from zarr.core.buffer import default_buffer_prototype

        aa, ab, bb = self._codecs
        proto = default_buffer_prototype()
        spec = ArraySpec(tuple(chunk_shape), self._zdtype, self._zdtype.default_scalar(), ArrayConfig("C", False), proto)
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


def _core_scalar(data_type: str, fill):
    """The fill value of a core data type from its Zarr v3 JSON form, read as zarr-python 3
    reads it (numbers; "NaN", "Infinity", "-Infinity" and "0x..." raw bits for floats; [re, im]
    for complex; any JSON value for bool, as its truth). ValueError or TypeError when invalid."""
    dt = np.dtype(CORE_TYPES[data_type])
    if dt.kind == "b":
        return np.bool_(fill)
    if dt.kind in "iu":
        if isinstance(fill, float) and fill.is_integer() or isinstance(fill, str):
            fill = int(fill)
        if not isinstance(fill, int):
            raise TypeError(f"Invalid type: {fill!r}. Expected an integer.")
        info = np.iinfo(dt)
        if not info.min <= fill <= info.max:
            raise ValueError(f"{fill} is out of the range of {data_type}")
        return dt.type(fill)
    if dt.kind == "f":
        with np.errstate(over="ignore"):  # past the type's range: infinity, as zarr-python has it
            return dt.type(_json_float(fill, strings=True))
    if isinstance(fill, str) or not isinstance(fill, (list, tuple)) or len(fill) != 2:
        raise TypeError(f"Invalid type: {fill!r}. Expected [real, imaginary].")
    return dt.type(complex(_json_float(fill[0]), _json_float(fill[1])))


def _json_float(v, strings: bool = False) -> float:
    """A float from its Zarr v3 JSON form; `strings`: decimal strings ("1.5") too."""
    special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    if isinstance(v, str) and v in special:
        return special[v]
    if isinstance(v, str) and v.startswith("0x"):
        width = {4: ">e", 8: ">f", 16: ">d"}.get(len(v) - 2)
        if width is None:
            raise ValueError(f"Invalid hexadecimal float value: {v!r}")
        return float(struct.unpack(width, bytes.fromhex(v[2:]))[0])
    if isinstance(v, (int, float)) or (strings and isinstance(v, str)):
        return float(v)
    raise TypeError(f"Invalid type: {v!r}. Expected a float.")


def _float_json(v):
    return "NaN" if np.isnan(v) else ("Infinity" if v > 0 else "-Infinity") if np.isinf(v) else float(v)


def _zdtype(data_type):
    _zarr3()
    from zarr.core.dtype import get_data_type_from_json

    return get_data_type_from_json(data_type, zarr_format=3)


def fill_value(data_type, fill):
    """The fill value of a Zarr v3 array as a NumPy scalar, from its JSON form (any form the
    v3 spec allows: "NaN", hex floats, [re, im], base64 bytes; bare NaN tokens too)."""
    if isinstance(data_type, str) and data_type in CORE_TYPES:
        return _core_scalar(data_type, fill)
    return _zdtype(data_type).from_json_scalar(fill, zarr_format=3)


def fill_value_json(data_type, fill, zarr_format: int):
    """The fill value written the way the given Zarr spec wants it for the data type: bool as
    true/false, non-finite floats as "NaN"/"Infinity"/"-Infinity" strings, complex as a pair,
    fixed-length bytes as base64 (zarr-python's own encoders for each format). Raises
    ValueError when the fill value is not valid for the data type."""
    if isinstance(data_type, str) and data_type in CORE_TYPES:  # the same in both formats
        value = _core_scalar(data_type, fill)
        kind = value.dtype.kind
        if kind == "c":
            return [_float_json(value.real), _float_json(value.imag)]
        return bool(value) if kind == "b" else int(value) if kind in "iu" else _float_json(value)
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
    """One bytes->bytes stage of zarr's codec objects, never producing more than `exact`
    (when the metadata fixes the size) or `limit` bytes."""
    if STANDARD.get(name) == "bb":
        return buf.from_array_like(np.frombuffer(_bounded(name, buf.as_numpy_array(), exact, limit), np.uint8))
    result = _run(codec, buf, spec)
    bound = exact if exact is not None else limit
    if len(result) > bound:
        raise DecodeError(f"{name} decoded to {len(result)} bytes, the chunk allows {bound}")
    return result


@functools.cache
def _blosc():
    import numcodecs

    return numcodecs.Blosc()  # decoding reads the settings from the frame header


def _bounded(name: str, data, exact: int | None, limit: int):
    """A standard bytes->bytes stage (gzip, zstd, blosc, crc32c) decoded, never producing
    more than `exact` (when the metadata fixes the size) or `limit` bytes."""
    bound = exact if exact is not None else limit
    data = np.frombuffer(data, np.uint8)
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
        out = _blosc().decode(data)
    elif name == "crc32c":
        if len(data) < 4 or crc32c.crc32c(data[:-4]) != int.from_bytes(data[-4:].tobytes(), "little"):
            raise DecodeError("crc32c checksum does not match")
        out = data[:-4]
    else:
        raise ValueError(f"not a standard bytes->bytes codec: {name!r}")
    if exact is not None and len(out) != exact:
        raise DecodeError(f"{name} decoded to {len(out)} bytes, the chunk needs {exact}")
    return out


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
