"""OCDBT over HTTP: the http section's array (64 KiB uint8 chunks, 2048 x 2048 shards) written
by tensorstore twice, as a plain sharded Zarr v3 store and inside an OCDBT database (the zarr3
driver over the `ocdbt` kvstore), both served by nginx on loopback; every chunk file read
through a fresh mount of each (`find | xargs cat`, default read-ahead), alternated in each run:
seconds, requests and bytes at nginx (bytes as a multiple of the chunk bytes), daemon RSS.

`run(...)` is called by scripts/bench.py (section `ocdbt`) with its helpers.
"""

from __future__ import annotations

from pathlib import Path

TITLE = ("OCDBT over HTTP (nginx on loopback), 64 KiB chunks: the same array as a sharded Zarr v3 store and inside "
         "an OCDBT database; seconds, requests (nginx log), bytes / chunk bytes")
HEADER = ["chunks", "readers", "store", "seconds", "requests", "chunks per request", "bytes ratio", "RSS MiB"]


def run(work: Path, runs: int, quick: bool, *, write_sharded, mounted, read_all, median, peak_rss, nginx) -> list[dict]:
    count = 256 if quick else 4096
    side = int(count ** 0.5)
    shape, chunk, shard = (side * 256, side * 256), (256, 256), (2048, 2048)
    stores = {"sharded": work / f"ocdbt-plain-{count}.zarr", "OCDBT": work / f"ocdbt-{count}"}
    write_sharded(stores["sharded"], shape, chunk, shard)
    write_sharded(stores["OCDBT"], shape, chunk, shard,
                  kvstore={"driver": "ocdbt", "base": f"file://{stores['OCDBT']}/"})
    chunk_bytes = count * chunk[0] * chunk[1]
    rows = []
    ng = nginx(work, work / "nginx-ocdbt").start()
    try:
        for readers in (1, 4):
            figures = {name: {"t": [], "reqs": [], "bytes": [], "rss": 0} for name in stores}
            for _ in range(runs):
                for name, path in stores.items():  # alternated
                    f = figures[name]
                    with mounted(f"{ng.url}/{path.name}") as (mnt, pid, _):
                        mark = ng.mark()
                        f["t"].append(read_all(mnt, readers))
                        r = ng.requests(mark)
                        f["reqs"].append(len(r))
                        f["bytes"].append(sum(x.nbytes for x in r))
                        f["rss"] = max(f["rss"], peak_rss(pid))
            for name, f in figures.items():
                rows.append({"section": "ocdbt", "chunks": count, "readers": readers, "store": name, "seconds": median(f["t"]),
                             "requests": median(f["reqs"]), "bytes_ratio": median(f["bytes"]) / chunk_bytes,
                             "rss_mib": f["rss"] >> 20})
    finally:
        ng.stop()
    return rows


def fmt(r: dict, rows: list[dict]) -> str:
    return (f"| {r['chunks']} | {r['readers']} | {r['store']} | {r['seconds']:.2f} | {r['requests']:.0f} | "
            f"{r['chunks'] / max(1, r['requests']):.1f} | {r['bytes_ratio']:.3f} | {r['rss_mib']} |")
