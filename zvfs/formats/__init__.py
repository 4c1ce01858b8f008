"""Format layer: one module per store kind. Each parses metadata and shard indexes and maps a
virtual chunk to a `ChunkRef` (shard key, offset, length, decode step). No FUSE here."""

from .chunkref import ChunkRef

__all__ = ["ChunkRef"]
