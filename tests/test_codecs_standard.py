"""The standard codec chains and core data types, which zvfs parses and decodes without
zarr-python (zvfs/formats/codecs.py), give the answers zarr-python 3 gives: the same chains
refused, the same chunk values from chunks zarr-python wrote, the same fill values read and
written. No mount.
"""

from __future__ import annotations

import itertools
import json

import numcodecs
import numpy as np
import pytest
import zarr

from zvfs.formats import codecs as C

LE, BE = {"name": "bytes", "configuration": {"endian": "little"}}, {"name": "bytes", "configuration": {"endian": "big"}}
GZIP, ZSTD = {"name": "gzip", "configuration": {"level": 1}}, {"name": "zstd", "configuration": {"level": 3, "checksum": True}}
BLOSC = {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 2, "blocksize": 0}}
CRC = {"name": "crc32c"}
T10 = {"name": "transpose", "configuration": {"order": [1, 0]}}

#: chains zarr-python accepts (for 2-d arrays)
VALID = [[LE], [BE], [{"name": "bytes"}], [LE, GZIP], [BE, ZSTD, CRC], [T10, LE, BLOSC], [T10, T10, BE, GZIP, CRC],
         [LE, CRC, ZSTD], [LE, {"name": "crc32c", "configuration": {}}], [LE, {"name": "gzip", "configuration": {}}],
         [LE, {"name": "blosc", "configuration": {"cname": "zstd", "typesize": None, "shuffle": None}}],
         [LE, {"name": "zstd", "configuration": {"level": -3}}]]
#: chains with a fault zarr-python refuses, or that are fine for one-byte values only
DOUBTFUL = [[], [GZIP], [LE, LE], [GZIP, LE], [LE, T10], [{"name": "transpose", "configuration": {"order": [0, 0]}}, LE],
            [{"name": "transpose", "configuration": {"order": [0]}}, LE], [{"name": "transpose", "configuration": {"order": "C"}}, LE],
            [{"name": "transpose", "configuration": {}}, LE], [{"name": "transpose"}, LE],
            [{"name": "bytes", "configuration": {"endian": None}}], [{"name": "bytes", "configuration": {"endian": "middle"}}],
            [{"name": "bytes", "configuration": {"endian": "little", "x": 1}}], [{"name": "bytes", "configuration": []}],
            [LE, {"name": "gzip"}], [LE, {"name": "gzip", "configuration": {"level": 10}}],
            [LE, {"name": "gzip", "configuration": {"level": "1"}}], [LE, {"name": "zstd", "configuration": {"level": 23}}],
            [LE, {"name": "zstd", "configuration": {"checksum": 1}}], [LE, {"name": "blosc", "configuration": {"cname": "lzma"}}],
            [LE, {"name": "blosc", "configuration": {"typesize": 0}}], [LE, {"name": "blosc", "configuration": {"shuffle": 1}}],
            [LE, {"name": "blosc", "configuration": {"clevel": 1.5}}], [LE, {"name": "crc32c", "configuration": 3}]]
TYPES = list(C.CORE_TYPES)


def _same(ours: C.Chain | None, theirs: C.Chain | None) -> None:
    assert (ours is None) == (theirs is None)
    if ours is not None:
        assert ours == theirs and ours.dtype() == theirs.dtype()


@pytest.mark.parametrize("data_type", TYPES)
def test_chains_parse_as_zarr_parses_them(data_type):
    for chain in VALID + DOUBTFUL:
        assert C.standard(chain, data_type)
        _same(C.Chain._standard(chain, data_type, 2), C.Chain._zarr(chain, data_type, 2))
    assert C.Chain.parse([{"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}}, LE], "int32", 2)._values is None


@pytest.mark.parametrize("data_type", ["uint16", "float32", "complex64", "bool", "int64"])
def test_chunks_zarr_wrote_decode_to_its_values(data_type):
    rng = np.random.default_rng(7)
    values = (rng.random((13, 9)) * 1000).astype(np.dtype(C.CORE_TYPES[data_type]))
    for chain in VALID:
        stored: dict = {}
        meta = {"zarr_format": 3, "node_type": "array", "shape": [13, 9], "data_type": data_type,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [13, 9]}},
                "chunk_key_encoding": {"name": "default"}, "fill_value": [0, 0] if data_type.startswith("complex") else 0, "codecs": chain}
        stored["zarr.json"] = zarr.core.buffer.cpu.Buffer.from_bytes(json.dumps(meta).encode())
        zarr.open_array(zarr.storage.MemoryStore(stored), mode="r+")[...] = values
        raw = stored["c/0/0"].to_bytes()
        ours = C.Chain.parse(chain, data_type, 2)
        assert ours._values is not None
        got = ours.decode(raw, data_type, (13, 9))
        assert got.dtype == ours.dtype() and np.array_equal(got, values), chain
        assert np.array_equal(C.Chain._zarr(chain, data_type, 2).decode(raw, data_type, (13, 9)), values)
        with pytest.raises(C.DecodeError):
            ours.decode(raw[:-1] + bytes([raw[-1] ^ 1]) if C.name_of(chain[-1]) == "crc32c" else raw[:len(raw) // 2],
                        data_type, (13, 9))


FILLS = [0, 1, -1, 255, 256, 65536, -129, 2**63, 1.0, 1.5, -0.0, 1e300, True, False, None, "NaN", "Infinity",
         "-Infinity", "0x7fc00000", "0x3c00", "0x3ff0000000000000", "0x12", "0xzz00", "1.5", "7", "x", [1, 2],
         [1.5, "NaN"], ["1.5", 0], ["0x7fc00000", "-Infinity"], [1], {"a": 1}]


def _outcome(fn, *args):
    try:
        return json.dumps(fn(*args))
    except (ValueError, TypeError, OverflowError):
        return "refused"


@pytest.mark.parametrize("data_type", TYPES)
def test_fill_values_read_and_write_as_zarr_has_them(data_type):
    def zarrs(fill, fmt):
        z = C._zdtype(data_type)
        return z.to_json_scalar(z.from_json_scalar(fill, zarr_format=3), zarr_format=fmt)

    for fill, fmt in itertools.product(FILLS, (2, 3)):
        ours = _outcome(C.fill_value_json, data_type, fill, fmt)
        assert ours == _outcome(zarrs, fill, fmt), (fill, fmt)
        if ours != "refused":
            value = C.fill_value(data_type, fill)
            assert value.dtype == np.dtype(C.CORE_TYPES[data_type])
            assert value.tobytes() == C._zdtype(data_type).from_json_scalar(fill, zarr_format=3).tobytes()


def test_without_zarr_3_other_chains_say_why(monkeypatch):
    def missing():
        raise C.NeedsZarr3("zarr-python 2.18.7 is installed, not 3")

    monkeypatch.setattr(C, "_zarr3", missing)
    delta = [{"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}}, LE]
    assert C.Chain.parse(delta, "int32", 1) is None
    assert C.undecodable(delta, "int32") == ("codecs ['numcodecs.delta', 'bytes'] of data type 'int32' need zarr-python 3 "
                                             "(zarr-python 2.18.7 is installed, not 3)")
    with pytest.raises(ValueError, match="2.18.7"):
        C.fill_value_json("string", "", 2)
    frame = numcodecs.Zstd(level=3, checksum=True).encode(np.arange(5, dtype="<i4").tobytes())
    assert C.Chain.parse([LE, ZSTD], "int32", 1).decode(frame, "int32", (5,)).tolist() == list(range(5))  # no zarr needed


DUMP = r'''
import hashlib, json, sys
if sys.argv[2] == "absent":
    sys.modules["zarr"] = None  # import zarr: ImportError
import fsspec
out = {}
for view in ("n5", "zarr2", "zarr"):
    fs = fsspec.filesystem("zvfs", fo=sys.argv[1], view=view, skip_instance_cache=True)
    out[view] = {p: hashlib.sha256(fs.cat_file(p)).hexdigest() for p in sorted(fs.find(""))}
print(json.dumps({"views": out, "zarr": "zarr" in sys.modules and sys.modules["zarr"] is not None}))
'''


def test_without_zarr_every_view_of_a_standard_store_is_the_same(tmp_path):
    """With zarr-python absent, every file of every view of a store of standard chains (little-
    endian values transcoded to N5's big-endian blocks, a transpose, NaN fill, crc32c) is what it
    is with zarr-python 3 there."""
    import subprocess
    import sys

    root = tmp_path / "s.zarr"
    g = zarr.open_group(root, mode="w", zarr_format=3)
    rng = np.random.default_rng(3)
    g.create_array("u16", shape=(40, 30), chunks=(8, 8), shards=(16, 16), dtype="<u2", fill_value=7,
                   compressors=zarr.codecs.ZstdCodec(level=1))[:30] = rng.integers(0, 9999, (30, 30))
    g.create_array("f4", shape=(9, 10, 11), chunks=(4, 4, 4), shards=(8, 8, 8), dtype="float32", fill_value=float("nan"),
                   filters=[zarr.codecs.TransposeCodec(order=(2, 1, 0))],
                   compressors=zarr.codecs.GzipCodec(level=1))[:8] = rng.random((8, 10, 11))
    g.create_array("i16", shape=(50,), chunks=(8,), shards=(16,), dtype="<i2", fill_value=-1,
                   compressors=[zarr.codecs.ZstdCodec(level=1), zarr.codecs.Crc32cCodec()])[:40] = np.arange(40) - 20
    runs = {}
    for zarr_there in ("absent", "present"):
        r = subprocess.run([sys.executable, "-c", DUMP, str(root), zarr_there], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[zarr_there] = json.loads(r.stdout)
    assert runs["absent"]["zarr"] is False
    assert runs["absent"]["views"] == runs["present"]["views"]
    assert all(len(files) > 25 for files in runs["absent"]["views"].values()), {v: len(f) for v, f in runs["absent"]["views"].items()}
