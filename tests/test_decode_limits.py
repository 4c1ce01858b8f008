"""Decoder output limits, bad chunks in the N5 view's transcoding path, and fill blocks at a
large grid.

A decompression bomb (a small frame that inflates to 1 GiB) inside a shard is EIO for its N5
block, one log line, and the daemon's peak RSS stays under the memory budget while the other
blocks of the array read like zarr-python reads them from the original. Shards are built here
byte by byte (the bombs cannot come from a writer); the rest of each array is what
numcodecs encodes.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import time
import zlib
from pathlib import Path

import crc32c
import numcodecs
import numpy as np
import pytest

from conftest import zvfs_mount

pytestmark = pytest.mark.mount

GIB = 2**30
CHUNK = (32, 32)
SHAPE = (64, 64)


def _zstd_bomb(declare_size: bool) -> bytes:
    import zstandard  # a test dependency (cloud-files): streams 1 GiB of zeros without holding it

    c = zstandard.ZstdCompressor(level=3, write_content_size=declare_size)
    obj = c.compressobj(size=GIB if declare_size else -1)
    zeros = bytes(1 << 22)
    out = [obj.compress(zeros) for _ in range(GIB // len(zeros))]
    return b"".join(out) + obj.flush()


def _gzip_bomb() -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 22)
    return b"".join(c.compress(zeros) for _ in range(GIB // len(zeros))) + c.flush()


def _write_sharded(root: Path, name: str, codec: dict, chunks: list[bytes]) -> None:
    """One shard holding the four inner chunks (C order), index at the end with crc32c."""
    meta = {"zarr_format": 3, "node_type": "array", "shape": list(SHAPE), "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHAPE)}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(CHUNK), "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, codec],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}]}
    d = root / name
    (d / "c" / "0").mkdir(parents=True)
    (d / "zarr.json").write_text(json.dumps(meta))
    index, offset = [], 0
    for c in chunks:
        index += [offset, len(c)]
        offset += len(c)
    index_bytes = np.array(index, dtype="<u8").tobytes()
    (d / "c" / "0" / "0").write_bytes(b"".join(chunks) + index_bytes + crc32c.crc32c(index_bytes).to_bytes(4, "little"))


@pytest.fixture(scope="module")
def bomb_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bombs") / "bombs.zarr"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    data = np.arange(64 * 64, dtype="<u2").reshape(SHAPE) * 7
    blocks = [data[i:i + 32, j:j + 32].tobytes() for i in (0, 32) for j in (0, 32)]
    zstd = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}
    gz = {"name": "gzip", "configuration": {"level": 5}}
    valid_zstd = [numcodecs.Zstd(3).encode(b) for b in blocks]
    valid_gzip = [gzip.compress(b) for b in blocks]
    bad = {
        "zstd_declared": (zstd, _zstd_bomb(True), valid_zstd),
        "zstd_stream": (zstd, _zstd_bomb(False), valid_zstd),
        "gzip": (gz, _gzip_bomb(), valid_gzip),
        "garbage": (zstd, b"\x28\xb5\x2f\xfd" + os.urandom(200), valid_zstd),
    }
    for name, (codec, first, valid) in bad.items():
        assert len(first) < 2 << 20  # a small frame that inflates to 1 GiB
        _write_sharded(root, name, codec, [first, *valid[1:]])
    return root, data, list(bad)


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) * 1024


def test_bombs_are_eio_for_their_block_and_rss_stays_in_budget(bomb_store, tmp_path):
    import tensorstore as ts
    import zarr

    root, data, names = bomb_store
    budget = 256 << 20  # the default memory budget
    log = tmp_path / "zvfs.log"
    with zvfs_mount(root, tmp_path / "mnt", log=log, options=("view=n5",)) as mnt:
        pid = int(subprocess.run(["pgrep", "-f", f"zvfs mount {root} "], capture_output=True, text=True).stdout.split()[0])
        for name in names:
            t0 = time.monotonic()
            with pytest.raises(OSError) as e:
                (mnt / name / "0" / "0").read_bytes()  # N5 block (0, 0): x first
            assert e.value.errno == errno.EIO, name
            assert time.monotonic() - t0 < 10, f"{name}: the bomb took {time.monotonic() - t0:.1f} s to refuse"
            # the other blocks read like zarr-python reads them from the original
            t = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(mnt / name)},
                         "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
            got = np.asarray(t[:, 32:].read().result()).T  # N5 (x, y): array rows 32..63
            want = zarr.open_array(str(root / name), mode="r")[32:, :]
            assert np.array_equal(got, want) and np.array_equal(got, data[32:, :]), name
        peak = _peak_rss(pid)
    assert peak < budget, f"daemon peak RSS {peak >> 20} MiB over the {budget >> 20} MiB budget"
    text = log.read_text()
    assert "Traceback" not in text and "internal error" not in text
    for name in names:
        lines = [line for line in text.splitlines() if f"chunk [0, 0] of {name}" in line]
        assert len(lines) == 1, (name, lines)  # one line per bad block read


def test_fill_blocks_are_found_by_name_and_not_listed(tmp_path):
    """A 4000 x 4000 grid (16 million positions) with a non-zero fill value and one stored
    shard: the listing shows the stored chunks at once, any other block opens by name as a
    fill block."""
    import tensorstore as ts
    import zarr

    src = tmp_path / "fill.zarr"
    a = zarr.create_array(str(src), shape=(32000, 32000), chunks=(8, 8), shards=(16, 16), dtype="int16", fill_value=-5,
                          compressors=None, zarr_format=3)
    a[:16, :16] = np.arange(256, dtype="int16").reshape(16, 16)
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=("view=n5",)) as mnt:
        t0 = time.monotonic()
        top = sorted(os.listdir(mnt))
        below = sorted(os.listdir(mnt / "0"))
        listing = time.monotonic() - t0
        assert top == ["0", "1", "attributes.json"] and below == ["0", "1"]
        block = (mnt / "3999" / "3999").read_bytes()  # never stored: a fill block
        t = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(mnt)}}).result()
        corner = np.asarray(t[31990:, 31990:].read().result()).T
        stored = np.asarray(t[:24, :24].read().result()).T
    assert listing < 2.0, f"listing took {listing:.2f} s"
    dims = [int.from_bytes(block[4 + 4 * i:8 + 4 * i], "big") for i in range(2)]
    assert dims == [8, 8] and np.all(np.frombuffer(block[12:], ">i2") == -5)
    assert np.all(corner == -5)
    want = zarr.open_array(str(src), mode="r")[:24, :24]
    assert np.array_equal(stored, want)


# ---------------------------------------------------------------------------- decoder limits, no mount


def test_chain_decode_limits():
    from zvfs.formats.codecs import VLEN_MAX, Chain, DecodeError

    raw16 = [{"name": "bytes", "configuration": {"endian": "little"}}]
    blosc = Chain.parse([*raw16, {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 9, "shuffle": "noshuffle",
                                                                      "typesize": 2, "blocksize": 0}}], "uint16", 1)
    frame = numcodecs.Blosc(cname="zstd", clevel=9).encode(np.zeros(64 << 20, np.uint8))
    with pytest.raises(DecodeError, match="blosc header declares"):
        blosc.decode(frame, "uint16", (1000,))
    ok = numcodecs.Blosc(cname="zstd", clevel=9).encode(np.arange(1000, dtype="<u2"))
    assert np.array_equal(blosc.decode(ok, "uint16", (1000,)), np.arange(1000))
    zstd = Chain.parse([*raw16, {"name": "zstd", "configuration": {"level": 1, "checksum": False}}], "uint16", 1)
    two_frames = numcodecs.Zstd().encode(np.zeros(1000, "<u2")) * 2  # each declares 2000 bytes; 4000 in all
    with pytest.raises(DecodeError):
        zstd.decode(two_frames, "uint16", (1000,))
    vlen = Chain.parse([{"name": "vlen-bytes"}, {"name": "zstd", "configuration": {"level": 1, "checksum": False}}], "bytes", 1)
    big = numcodecs.Zstd().encode(numcodecs.VLenBytes().encode(np.array([bytes(VLEN_MAX)], dtype=object)))
    with pytest.raises(DecodeError, match="declares"):
        vlen.decode(big, "bytes", (1,))
    small = numcodecs.Zstd().encode(numcodecs.VLenBytes().encode(np.array([b"ab", b""], dtype=object)))
    assert list(vlen.decode(small, "bytes", (2,))) == [b"ab", b""]


@pytest.mark.parametrize("kind", ["passthrough", "transcoded"])
def test_a_shard_cut_short_is_eio_never_short_bytes(tmp_path, kind):
    """Both N5 block paths read the chunk through the Zarr view's checked range read: a block
    whose bytes were cut off the shard while mounted is EIO, never a short block."""
    import zarr

    src = tmp_path / "cut.zarr"
    dtype = "uint8" if kind == "passthrough" else "<u2"  # one-byte zstd passes through, little-endian is transcoded
    a = zarr.create_array(str(src), shape=(64, 64), chunks=(32, 32), shards=(64, 64), dtype=dtype, fill_value=0,
                          compressors=zarr.codecs.ZstdCodec(level=1), zarr_format=3)
    a[...] = np.random.default_rng(1).integers(0, 250, size=(64, 64)).astype(dtype)
    shard = src / "c" / "0" / "0"
    log = tmp_path / "zvfs.log"
    with zvfs_mount(src, tmp_path / "mnt", log=log, options=("view=n5",)) as mnt:
        block = mnt / "1" / "1"  # the last chunk in the shard: past the cut
        assert os.path.getsize(block) > 0  # located (index read) before the cut
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 3)
        with pytest.raises(OSError) as e:
            block.read_bytes()
        assert e.value.errno == errno.EIO
    text = log.read_text()
    assert "Traceback" not in text and "internal error" not in text
