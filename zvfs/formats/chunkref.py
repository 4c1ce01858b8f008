"""Where the bytes of one virtual file live."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..storage.base import Version


@dataclass(slots=True)
class ChunkRef:
    """Bytes `[offset, offset+length)` of store key `key`, passed through `decode` if set.
    Never changed once made (not `frozen`: a frozen dataclass's constructor cost 0.65 µs
    against 0.23, and one is made per chunk file opened). Two refs are the same chunk when
    they name the same bytes of the same version: the decode step is not compared (it is
    rebuilt per lookup, and comparing it made every reopen drop the kernel's cached pages).

    `decode` is None for pass-through chunks (the common case: the bytes of the inner chunk are
    exactly the bytes of the unsharded chunk file, and the file size is `length`).
    `version` is the version of `key` the range was taken from (from its shard index): reads
    expect it, so a range is never read from a rewritten shard. `evidence`, for a version that
    was not settled when its index was read (`Version.settled`): the index bytes that located
    the chunk, as `storage.base.proof`s, which a read checks again after the data
    (`Pin.verify`) before serving it.
    """

    key: str
    offset: int
    length: int
    decode: Callable[[bytes], bytes] | None = field(default=None, compare=False)  # a new closure per lookup
    version: Version | None = None
    evidence: tuple | None = field(default=None, compare=False)
