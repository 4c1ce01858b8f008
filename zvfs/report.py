"""`zvfs inspect`: what a store holds and how zvfs will show it.

Counts come from the shard indexes (the same ones the mount uses), so `chunks_present` is the
number of chunk files a mount lists.
"""

from __future__ import annotations

from .formats.zarr3 import META, ArrayNode, ShardedArray
from .source import OpenSource
from .storage.base import Store


async def _stored_keys(store: Store, prefix: str) -> list[int]:
    """Sizes of every key below `prefix` except metadata (chunks of an array shown as stored)."""
    sizes, todo = [], [prefix]
    while todo:
        p = todo.pop()
        for e in await store.list(p) or []:
            key = f"{p}/{e.name}" if p else e.name
            if e.is_dir:
                todo.append(key)
            elif e.name != META:
                sizes.append(e.size if e.size is not None else await store.size(key) or 0)
    return sizes


async def _describe_array(src: OpenSource, node: ArrayNode) -> dict:
    meta = node.meta
    info = {
        "path": node.path,
        "shape": list(node.shape),
        "dtype": meta.get("data_type"),
        "sharded": node.sharded,
        "shard_shape": list(node.chunk_shape) if node.sharded else None,
        "inner_chunk_shape": list(node.plan.chunk_shape) if node.plan else (None if node.sharded else list(node.chunk_shape)),
        "codecs": meta.get("codecs"),
        "unsharded": not node.sharded or node.plan is not None,
        "warning": node.warning,
    }
    if node.plan is None:
        sizes = await _stored_keys(src.store, node.path)
        info.update(shards_present=len(sizes) if node.sharded else None,
                    chunks_present=None if node.sharded else len(sizes), bytes=sum(sizes))
        return info
    array = ShardedArray(node, src.store, src.cache)
    shards = chunks = nbytes = 0
    for shard in array.shards_touching(()):
        if await array.index(array.shard_key(shard), 0, None, 0) is None:
            continue
        shards += 1
        for coords in await array.chunks_in_shard(shard):
            ref = await array.locate(tuple(int(c) for c in coords))
            if ref is not None:
                chunks += 1
                nbytes += ref.length
    info.update(shards_present=shards, chunks_present=chunks, bytes=nbytes)
    return info


async def describe(src: OpenSource) -> dict:
    arrays = [n for _, n in sorted(src.zarr_nodes.items()) if isinstance(n, ArrayNode)]
    return {
        "source": src.store.display,
        "kind": src.kind,
        "view": src.view,
        "arrays": [await _describe_array(src, n) for n in arrays],
    }


def _shape(s) -> str:
    return "-" if s is None else "(" + ", ".join(map(str, s)) + ")"


def _codecs(codecs) -> str:
    def name(c):
        if isinstance(c, dict) and c.get("name") == "sharding_indexed":
            return "sharding_indexed[" + ",".join(name(i) for i in c.get("configuration", {}).get("codecs", [])) + "]"
        return c.get("name", "?") if isinstance(c, dict) else str(c)

    return ", ".join(name(c) for c in codecs or [])


def render(report: dict) -> str:
    lines = [f"{report['source']}: {report['kind']}, {report['view']} view, {len(report['arrays'])} arrays"]
    for a in report["arrays"]:
        lines.append(f"\n{a['path'] or '/'}")
        lines.append(f"  shape {_shape(a['shape'])}  dtype {a['dtype']}")
        lines.append(f"  shard shape {_shape(a['shard_shape'])}  inner chunk shape {_shape(a['inner_chunk_shape'])}")
        lines.append(f"  codecs {_codecs(a['codecs'])}")
        present = []
        if a["shards_present"] is not None:
            present.append(f"{a['shards_present']} shards")
        if a["chunks_present"] is not None:
            present.append(f"{a['chunks_present']} inner chunks")
        lines.append(f"  present: {', '.join(present)}, {a['bytes']} bytes")
        if a["warning"]:
            lines.append(f"  WARNING: {a['warning']}")
    return "\n".join(lines)
