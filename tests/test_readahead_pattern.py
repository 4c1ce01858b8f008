"""Read-ahead follows the access pattern (issue 11 point 1), counted in nginx's access log.

- Sparse: one random chunk in each shard, then three more rounds of a chunk in each that is no
  grid neighbour of the earlier ones, by 1, 4 and 16 parallel readers: at most 1.25x the chunk and index bytes (before:
  a 1 MiB window per second read, 29x).
- Sequential: `find | xargs cat` of the array: at least 8 chunks per request, at most 1.1x the
  bytes (`cp -r` is counted in tests/test_remote.py).

Fixture: a uint8 array of 256^3 in shards of 128^3 (8 shards of 2 MiB, 512 chunks each, as in
the issue's 256^3 shards of 32^3 chunks) with 16^3 inner chunks of 4 KiB, written by zarr-python without compression (so every chunk has the same
size and byte counts are exact); the bytes read through the mount are compared with the
array zarr-python reads from the original.
"""

from __future__ import annotations

import itertools
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import zvfs_mount
from servers import Nginx

pytestmark = pytest.mark.mount

SHAPE, SHARD, CHUNK = (256, 256, 256), 128, 16
PER_SHARD = SHARD // CHUNK  # chunks per shard along each axis
CHUNK_BYTES = CHUNK ** 3
INDEX_BYTES = PER_SHARD ** 3 * 16 + 4  # offset+length per chunk, crc32c


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import zarr

    d = tmp_path_factory.mktemp("pattern")
    data = np.random.default_rng(11).integers(1, 255, size=SHAPE, dtype="uint8")
    a = zarr.create_array(d / "a.zarr", shape=SHAPE, chunks=(CHUNK,) * 3, shards=(SHARD,) * 3, dtype="uint8",
                          compressors=None, fill_value=0)
    a[...] = data
    nginx = Nginx(d, tmp_path_factory.mktemp("pattern-nginx")).start()
    yield nginx, data
    nginx.stop()


def chunk_of(data: np.ndarray, coords) -> bytes:
    sl = tuple(slice(c * CHUNK, (c + 1) * CHUNK) for c in coords)
    return data[sl].tobytes()


def sparse_reads(seed: int, rounds: int = 4) -> list[list[tuple[int, ...]]]:
    """`rounds` lists of reads, one chunk per shard each: a random chunk, then in each later
    round a random chunk of the same shard that is no grid neighbour of the shard's earlier
    ones (some axis differs by 2 or more)."""
    rng = random.Random(seed)
    shards = list(itertools.product(*(range(s // SHARD) for s in SHAPE)))
    inner = list(itertools.product(range(PER_SHARD), repeat=3))
    picked: dict[tuple, list] = {shard: [] for shard in shards}
    out = []
    for _ in range(rounds):
        this = []
        for shard in shards:
            far = [c for c in inner if all(max(abs(x - y) for x, y in zip(c, p)) >= 2 for p in picked[shard])]
            c = rng.choice(far)
            picked[shard].append(c)
            this.append(tuple(s * PER_SHARD + i for s, i in zip(shard, c)))
        out.append(this)
    return out


@pytest.mark.parametrize("readers", [1, 4, 16])
def test_sparse_reads_fetch_little_more_than_they_read(served, tmp_path, readers):
    nginx, data = served
    rounds = sparse_reads(seed=readers)
    nshards = len(rounds[0])
    with zvfs_mount(f"{nginx.url}/a.zarr", tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        mark = nginx.mark()

        def read(coords) -> bool:
            return (mnt / "c" / "/".join(map(str, coords))).read_bytes() == chunk_of(data, coords)

        with ThreadPoolExecutor(readers) as pool:  # one round after the other, each in parallel
            ok = [good for reads in rounds for good in pool.map(read, reads)]
        reqs = nginx.requests(mark)
    assert all(ok)
    fetched = sum(r.nbytes for r in reqs if r.path.startswith("/a.zarr/c/"))
    needed = len(ok) * CHUNK_BYTES + nshards * INDEX_BYTES
    print(f"\n{readers} readers: {len(ok)} chunks, {len(reqs)} requests, {fetched} bytes fetched "
          f"= {fetched / needed:.3f}x the chunk and index bytes")
    assert fetched <= 1.25 * needed


def test_find_xargs_cat_fetches_at_least_8_chunks_per_request(served, tmp_path):
    nginx, data = served
    with zvfs_mount(f"{nginx.url}/a.zarr", tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        mark = nginx.mark()
        out = subprocess.run(f"find {mnt}/c -type f | sort -V | xargs cat | wc -c", shell=True, check=True,
                             capture_output=True, text=True, timeout=300).stdout
        reqs = nginx.requests(mark)
        files = sorted(p for p in (mnt / "c").rglob("*") if p.is_file())
        sample = random.Random(0).sample(files, 16)
        for p in sample:
            coords = tuple(int(x) for x in p.relative_to(mnt / "c").parts)
            assert p.read_bytes() == chunk_of(data, coords)
    nchunks = np.prod([s // CHUNK for s in SHAPE])
    assert int(out) == nchunks * CHUNK_BYTES == data.nbytes
    data_reqs = [r for r in reqs if r.path.startswith("/a.zarr/c/")]
    fetched = sum(r.nbytes for r in data_reqs)
    print(f"\nfind | xargs cat: {nchunks} chunks in {len(data_reqs)} requests "
          f"({nchunks / len(data_reqs):.1f} chunks per request), {fetched / data.nbytes:.3f}x the bytes")
    assert len(data_reqs) <= nchunks / 8
    assert fetched <= 1.1 * (data.nbytes + len({r.path for r in data_reqs}) * INDEX_BYTES)
