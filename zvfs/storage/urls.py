"""Sources as they may be shown: no credentials in logs, process titles or messages. (Apart
from `open.py` so that the mount front end, which only shows sources, loads no store code.)"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact(source: str) -> str:
    """The source as it may be shown (logs, /proc/mounts, process titles, inspect): a URL loses
    its user:password and its query string (signed URLs carry credentials there)."""
    if "://" not in source:
        return source
    try:
        parts = urlsplit(source)
    except ValueError:  # unparseable (http://[::1): show the scheme only, never the rest
        return source.split("://", 1)[0] + "://..."
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
