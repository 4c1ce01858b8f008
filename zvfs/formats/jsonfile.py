"""Metadata files are JSON objects; anything else is one clear error naming the file.

Metadata is read whole and parsed at mount time, and kept: no cache bounds it (issue 22: a 28 MiB `zarr.json` of `[{},{},...]` kept the
daemon at 768 MiB for the life of the mount; a 1 GiB sparse one peaked at 2,099 MiB before
the mount was refused; 300 arrays of 3.5 MB `zarr.json` each, every one within the limit,
took 1,062 MiB at the mount and 2,081 MiB once read). `read_metadata` reads at most `limit`
+ 1 bytes of a file and refuses it, before parsing, when what it would take parsed
(`parsed_size`) is over the limit (`max_metadata`), or, with a `MetadataTally`, when that and
what the metadata read before it takes are over the limit together.
"""

from __future__ import annotations

import json

from ..errors import MetadataError
from ..options import METADATA_SHARE, MountOptions
from ..storage.base import Store, Version

#: What json.loads takes per token at most, CPython 3.11, 64-bit; measured with tracemalloc
#: (peak during the parse, the decoded text included) over 300,000-element inputs of each
#: shape: an empty dict 64 bytes and a dict's first entry 120 (a one-entry dict is 184), an
#: empty list 56 plus its first slot and value, a further value 40 (a list slot 8 and an int
#: 28-32; a dict entry ~40 once the table has grown), a string object 49 + its characters.
#: Peak / estimate in bytes per input byte: `[{},{},...]` 25.2 / 56, `[{"":0},...]` 28.5 / 47,
#: 20-deep `{"":{"":...}}` 37.4 / 56 (the worst shape found), ints 10.2 / 13, distinct keys
#: 11.8 / 22, a 3 MB string with one character past U+FFFF 8.0 / 9.0; 3,000 random JSON
#: values (hypothesis) at most 0.79 of their estimate. Real metadata peaks at 2-8 bytes per
#: byte and is estimated at 2.4-4.2x that (a consolidated zarr.json of 300 arrays, 532 KiB:
#: 3.6 / 8.7; OME attributes, a precomputed info, the zarrita corpus).
PER_OBJECT, PER_ENTRY, PER_ARRAY, PER_VALUE, PER_QUOTE = 120, 96, 96, 40, 25
#: The parser's own fixed cost (scanner, memo dict): a 161-byte zarr.json peaks at 1.8 KiB.
PARSE_BASE = 4096


def parsed_size(raw: bytes) -> int:
    """An upper bound of the memory `json.loads(raw)` takes at its peak, from counts of the
    bytes that open objects, entries, arrays, values and strings (counted inside strings too,
    so it can only be over). The raw bytes, the decoded text and the strings' characters count
    as well: 1 byte per character, 4 when the text may hold characters past U+FFFF (non-ASCII
    bytes or \\u escapes). Counting costs ~5 ms per MiB: no parse is started that would not fit."""
    width = 1 if raw.isascii() and b"\\u" not in raw else 4
    return (PARSE_BASE + len(raw) * (1 + 2 * width) + PER_OBJECT * raw.count(b"{") + PER_ENTRY * raw.count(b":")
            + PER_ARRAY * raw.count(b"[") + PER_VALUE * raw.count(b",") + PER_QUOTE * raw.count(b'"'))


class MetadataTally:
    """What the metadata files read for one mount take parsed (`parsed_size`), all of them
    kept for the life of the mount: `max_metadata` bounds their sum, not only each file."""

    def __init__(self) -> None:
        self.used = 0
        self.files = 0


async def read_metadata(store: Store, key: str, where: str, limit: int | None,
                        tally: MetadataTally | None = None) -> tuple[bytes | None, Version | None]:
    """A metadata file's bytes and version ((None, None) when there is none), read with at most
    `limit` + 1 bytes asked for: a larger file, or one that would take more than `limit`
    parsed, alone or with what `tally` counts already, is a MetadataError naming the file, its
    size and the option (the file is counted in `tally` otherwise). `limit` None: the default
    of the default memory budget."""
    if limit is None:
        limit = MountOptions.memory // METADATA_SHARE
    raw, version = await store.read_version(key, 0, limit + 1)
    if raw is None:
        return None, None
    if len(raw) > limit:
        size = version.size if version is not None and version.size > limit else f"more than {limit}"
        raise MetadataError(where, f"{size} bytes: metadata files larger than max_metadata={size_text(limit)} are refused")
    cost = parsed_size(raw)
    if cost > limit:
        raise MetadataError(where, f"{len(raw)} bytes that would take about {size_text(cost)} parsed: "
                                   f"more than max_metadata={size_text(limit)}")
    if tally is not None:
        if tally.used + cost > limit:
            raise MetadataError(where, f"{len(raw)} bytes that would take about {size_text(cost)} parsed, after "
                                       f"{tally.files} metadata files taking about {size_text(tally.used)}: more than "
                                       f"max_metadata={size_text(limit)} in all")
        tally.used += cost
        tally.files += 1
    return raw, version


def size_text(n: int) -> str:
    """`n` bytes the way sizes are given to options (16M, 1.5M, 300K, 1234)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}" if n % (1 << shift) == 0 else f"{n / (1 << shift):.1f}{unit}"
    return str(n)


def parse_json_object(raw: bytes, where: str, what: str = "metadata") -> dict:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise MetadataError(where, f"malformed JSON ({e})") from None
    except RecursionError:  # json recurses per nesting level: [[[[...]]]] 200k deep ends here
        raise MetadataError(where, "JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise MetadataError(where, f"{what} is not a JSON object")
    return value
