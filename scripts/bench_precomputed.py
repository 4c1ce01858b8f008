"""Precomputed volumes through the Zarr v3, Zarr v2 and N5 views: reading every chunk file of a
mounted scale (`find | xargs cat`, a fresh mount per run) against tensorstore's
`neuroglancer_precomputed` driver reading the whole original (no cache), side by side in each
run, medians.

Two sharded volumes written by tensorstore, 64**3 chunks:
- raw uint8 (identity hash, raw data encoding): the stored chunks are the views' chunks
  (pass-through; N5 adds its block header);
- compressed_segmentation uint64 (blocky labels): every chunk file is decoded (transcoded)
  and kept in the decoded cache while it is read; the last column counts the decodes per
  chunk file (`zvfs stats`: misses of the decoded-chunk cache), 1.00 when each is decoded
  exactly once.

`run(runs)` returns the markdown rows under `HEADER`; `python scripts/bench_precomputed.py`
prints the table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

TITLE = ("Precomputed volumes through the array views: every chunk file of one scale (find | xargs cat, fresh mount), "
         "against tensorstore's precomputed driver reading the original, seconds")
HEADER = ["volume", "view (mode)", "chunk files", "MiB", "zvfs", "tensorstore precomputed", "zvfs/tensorstore",
          "decodes per file"]
SHARDING = {"@type": "neuroglancer_uint64_sharded_v1", "hash": "identity", "preshift_bits": 0, "minishard_bits": 3,
            "shard_bits": 2, "minishard_index_encoding": "gzip", "data_encoding": "raw"}
#: name -> (data type, encoding, volume size, mode in the views)
VOLUMES = {"raw uint8": ("uint8", "raw", (512, 512, 256), "pass-through"),
           "compressed_segmentation uint64": ("uint64", "compressed_segmentation", (256, 256, 256), "transcoded")}
CHUNK = (64, 64, 64)
KEY = "s0"


def write_volume(path: Path, dtype: str, encoding: str, size: tuple[int, int, int]) -> None:
    import tensorstore as ts

    if (path / "info").exists():
        return
    scale = {"key": KEY, "size": list(size), "chunk_size": list(CHUNK), "resolution": [8, 8, 8], "encoding": encoding,
             "sharding": SHARDING}
    if encoding == "compressed_segmentation":
        scale["compressed_segmentation_block_size"] = [8, 8, 8]
    t = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path) + "/"},
                 "multiscale_metadata": {"type": "image" if encoding == "raw" else "segmentation", "data_type": dtype,
                                         "num_channels": 1},
                 "scale_metadata": scale, "create": True}).result()
    rng = np.random.default_rng(7)
    if encoding == "raw":
        data = rng.integers(1, 255, (*size, 1), dtype=np.uint8)
    else:  # labels constant over 4**3 voxels: ~64 distinct labels per 8**3 block
        small = rng.integers(1, 2**40, tuple(s // 4 for s in size) + (1,), dtype=np.uint64)
        data = np.repeat(np.repeat(np.repeat(small, 4, 0), 4, 1), 4, 2)
    t[...] = data


def tensorstore_read(path: Path) -> float:
    import tensorstore as ts

    t = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path) + "/"},
                 "scale_metadata": {"key": KEY}, "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()
    start = time.perf_counter()
    t.read().result()
    return time.perf_counter() - start


def read_view(mnt: Path) -> tuple[float, int]:
    """Seconds to cat every chunk file of the scale, and how many there were."""
    start = time.perf_counter()
    out = subprocess.run(f"find {mnt}/{KEY} -type f ! -name '*.json' ! -name '.z*' -print0 | tee /dev/stderr | "
                         f"xargs -0 -n 64 cat > /dev/null", shell=True, check=True, capture_output=True)
    return time.perf_counter() - start, out.stderr.count(b"\0")


def decodes(mnt: Path) -> int:
    """Chunks the mount decoded so far (misses of its decoded-chunk cache, `zvfs stats`)."""
    out = subprocess.run([sys.executable, "-m", "zvfs", "stats", "--json", str(mnt)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["caches"].get("decoded", {}).get("misses", 0)


def run(runs: int, work: Path = Path("/var/tmp/zvfs-bench")) -> list[str]:
    from bench import log, median, mounted

    rows = []
    for name, (dtype, encoding, size, mode) in VOLUMES.items():
        src = work / f"precomputed-{dtype}-{encoding}"
        log(f"precomputed {name}: writing {np.prod(size) * np.dtype(dtype).itemsize >> 20} MiB")
        write_volume(src, dtype, encoding, size)
        mib = np.prod(size) * np.dtype(dtype).itemsize / (1 << 20)
        for view in ("zarr", "zarr2", "n5"):
            zvfs, ts_s, files, decoded = [], [], 0, 0
            for _ in range(runs):
                ts_s.append(tensorstore_read(src))
                with mounted(src, (f"view={view}",)) as (mnt, _, _):
                    seconds, files = read_view(mnt)
                    zvfs.append(seconds)
                    decoded = decodes(mnt)
            z, t = median(zvfs), median(ts_s)
            rows.append(f"| {name} | {view} ({mode}) | {files} | {mib:.0f} | {z:.3f} | {t:.3f} | {z / t:.2f} | "
                        f"{decoded / max(1, files):.2f} |")
    return rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", default="/var/tmp/zvfs-bench")
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    print(f"{TITLE}\n| {' | '.join(HEADER)} |\n|{'---|' * len(HEADER)}", flush=True)
    for row in run(args.runs, Path(args.work)):
        print(row, flush=True)
