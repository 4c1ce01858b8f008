"""Metadata files are JSON objects; anything else is one clear error naming the file."""

from __future__ import annotations

import json

from ..errors import MetadataError


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
