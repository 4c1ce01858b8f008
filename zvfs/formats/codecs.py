"""Zarr v3 codec chains in the terms other formats use, and chunk decoding where bytes cannot
simply pass through (N5 transcoding, ZVF objects). The codecs themselves are numcodecs'.

A chain here is the codec list of an (unsharded, or innermost) chunk:
[transpose]? (bytes | vlen-bytes) [bytes->bytes codec]*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numcodecs
import numpy as np

BYTES_TO_BYTES = {"gzip": numcodecs.GZip, "zstd": numcodecs.Zstd, "blosc": numcodecs.Blosc}
BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}

#: Zarr v3 data types with a fixed-size NumPy equivalent
NUMERIC = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"}


def name_of(codec) -> str:
    return codec if isinstance(codec, str) else codec.get("name", "")


def config_of(codec) -> dict:
    return (codec.get("configuration") or {}) if isinstance(codec, dict) else {}


@dataclass(frozen=True)
class Chain:
    """A codec chain taken apart: the transpose order (None: none), the array->bytes codec
    ("bytes" or "vlen-bytes") and its byte order, and the bytes->bytes codecs."""

    order: tuple[int, ...] | None
    serializer: str
    endian: str  # "<", ">" or "|" (one-byte or vlen)
    compressors: tuple

    @classmethod
    def parse(cls, codecs: list, data_type, ndim: int) -> "Chain | None":
        """None when the chain has codecs this module does not know."""
        order = None
        i = 0
        if i < len(codecs) and name_of(codecs[i]) == "transpose":
            o = config_of(codecs[i]).get("order")
            order = tuple(range(ndim)) if o == "C" else tuple(reversed(range(ndim))) if o == "F" else tuple(o)
            i += 1
        if i >= len(codecs) or name_of(codecs[i]) not in ("bytes", "vlen-bytes"):
            return None
        serializer = name_of(codecs[i])
        if serializer == "bytes":
            if data_type not in NUMERIC:
                return None
            one_byte = np.dtype(data_type).itemsize == 1
            endian = "|" if one_byte else ("<" if config_of(codecs[i]).get("endian", "little") == "little" else ">")
        else:
            endian = "|"
        rest = tuple(codecs[i + 1:])
        if any(name_of(c) not in BYTES_TO_BYTES for c in rest):
            return None
        return cls(order, serializer, endian, rest)

    def dtype(self, data_type) -> np.dtype:
        if self.serializer == "vlen-bytes":
            return np.dtype(object)
        dt = np.dtype(data_type)
        return dt if self.endian == "|" else dt.newbyteorder(self.endian)

    def decode(self, raw: bytes, data_type, chunk_shape: tuple[int, ...]) -> np.ndarray:
        """The chunk as an array in array axis order (object array for vlen-bytes)."""
        data = raw
        for c in reversed(self.compressors):
            data = BYTES_TO_BYTES[name_of(c)]().decode(data)
        if self.serializer == "vlen-bytes":
            return numcodecs.VLenBytes().decode(data)
        stored = chunk_shape if self.order is None else tuple(chunk_shape[a] for a in self.order)
        arr = np.frombuffer(data, dtype=self.dtype(data_type)).reshape(stored)
        return arr if self.order is None else arr.transpose(np.argsort(self.order))


def compressor(codec) -> numcodecs.abc.Codec:
    """numcodecs object for a v3 bytes->bytes codec, with its settings (for encoding)."""
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
