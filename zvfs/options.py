"""Mount options (`-o a,b=c`), parsed by zvfs itself.

pyfuse3 rejects libfuse's high-level options, and `mount -t fuse.zvfs`/fstab hand over the
generic mount(8) options too, so every option is parsed here: zvfs's own are typed and checked,
generic ones that make no sense for a read-only FUSE mount are accepted and ignored, anything
else is refused with a message naming it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from .errors import OptionError
from .names import View

VIEWS = tuple(View)
N5_COMPRESSIONS = ("raw", "gzip", "zstd", "blosc")

#: mount(8)/fstab options that are accepted and have no effect (zvfs is always read-only,
#: never has devices or set-uid files, and keeps no access times).
GENERIC = {
    "ro", "defaults", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "auto", "noauto",
    "user", "nouser", "users", "owner", "atime", "noatime", "relatime", "strictatime",
    "nodiratime", "diratime", "async", "sync", "_netdev", "nofail", "default_permissions",
}

#: option name -> (field, kind, help)
OWN = {
    "view": ("view", "view", "view to show: " + ", ".join(VIEWS) + " (default: the store's own kind)"),
    "n5_compression": ("n5_compression", "n5c", "N5 view: compression of transcoded blocks: raw (default), gzip, zstd, blosc"),
    "allow_other": ("allow_other", "flag", "let other users see the mount (adds default_permissions)"),
    "log": ("log_file", "str", "append the daemon's log to this file"),
    "debug": ("debug", "flag", "log at debug level"),
    "memory": ("memory", "size", "memory budget: sizes the three caches below (default 256M)"),
    "index_cache": ("index_cache", "size", "bytes of decoded shard indexes to keep (default: a quarter of the caches' share of memory)"),
    "decoded_cache": ("decoded_cache", "size", "bytes of decoded (gunzipped) chunks and objects to keep (default: a quarter)"),
    "max_requests": ("max_requests", "int", "backend requests in flight at once (default 16)"),
    "max_background": ("max_background", "int", "kernel requests in flight at once on the FUSE connection (default 64)"),
    "readahead": ("readahead", "size", "largest read-ahead: remote stores read ahead in a shard walked in order (4x the read, doubling); local stores put the next files of a walk in listing order in the kernel's cache (default 1M, 0 = off)"),
    "request_timeout": ("request_timeout", "float", "remote stores: seconds one request may take (default 20)"),
    "retry_deadline": ("retry_deadline", "float", "remote stores: seconds to keep retrying a failing read before EIO (default 30)"),
    "block_cache": ("block_cache", "size", "remote stores: bytes of fetched shard data to keep (default: half)"),
    "cache_dir": ("cache_dir", "str", "remote stores: keep fetched indexes, metadata and chunk bytes in this directory across "
                                      "mounts, shared by every front and daemon that names it (default: none)"),
    "cache_size": ("cache_size", "size", "bytes the cache_dir may hold on disk (default 10G, at least 256K; least recently used dropped first)"),
    "max_metadata": ("max_metadata", "size", "metadata (zarr.json, info) to hold, as parsed: a file, or all of them "
                                             "together, estimated to take more refuses the mount (default: a quarter of memory)"),
    "mount_timeout": ("mount_timeout", "float", "seconds to wait for the mount to come up (default 60)"),
    "fsname": ("fsname", "str", "name shown as the mount's source in /proc/mounts (default: SOURCE)"),
    "endpoint": ("endpoint", "str", "s3:// and gs://: the service URL (S3-compatible servers, emulators); gs:// then "
                                    "takes credentials from GOOGLE_APPLICATION_CREDENTIALS or gcloud's file only, else none"),
    "region": ("region", "str", "s3://: the bucket's region"),
    "profile": ("profile", "str", "s3://: the credentials profile to use (~/.aws)"),
    "anon": ("anon", "flag", "s3:// and gs://: anonymous access (public buckets)"),
    "uid": ("uid", "uid", "owner shown for every file (a user name or number; default: the store's own, for remote stores the daemon's)"),
    "gid": ("gid", "gid", "group shown for every file (a group name or number; default: the store's own, for remote stores the daemon's)"),
    "umask": ("umask", "octal", "permission bits to clear from 0555/0444 for every node, whatever the store's own bits "
                                 "(e.g. umask=022 shares a store closed to others; default: the store's bits, never widened)"),
    "allow_root": ("allow_root", "flag", "let root (only) see the mount besides its owner (adds default_permissions)"),
    "follow_symlinks": ("follow_symlinks", "flag", "local stores: follow symlinks that lead outside the store (trusted stores only)"),
    "no_leases": ("no_leases", "flag", "local stores: take no read leases on shards (a shard replaced by rename then gives "
                                      "the handles open on it EIO instead of its old bytes; a lease makes a writer's open of "
                                      "the shard wait until the daemon lets go, about 1 ms)"),
    "nonempty": ("nonempty", "flag", "mount on a mount point that holds files (hidden while mounted; refused otherwise)"),
    "version": ("version", "str", "OCDBT databases: the version to show, a generation number or a commit time in ISO 8601 "
                                  "(the latest committed then or before; default: the latest)"),
}


@dataclass
class MountOptions:
    view: View | None = None
    n5_compression: str = "raw"
    allow_other: bool = False
    log_file: str | None = None
    debug: bool = False
    memory: int = 256 << 20
    index_cache: int | None = None
    decoded_cache: int | None = None
    max_requests: int = 16
    max_background: int = 64
    readahead: int = 1 << 20
    request_timeout: float = 20.0
    retry_deadline: float = 30.0
    block_cache: int | None = None
    max_metadata: int | None = None
    cache_dir: str | None = None
    cache_size: int | None = None
    mount_timeout: float = 60.0
    fsname: str | None = None
    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    anon: bool = False
    follow_symlinks: bool = False
    no_leases: bool = False
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None
    allow_root: bool = False
    nonempty: bool = False
    version: str | None = None
    ignored: list[str] = field(default_factory=list)


#: memory the interpreter, libraries and in-flight buffers need besides the caches (measured
#: ~60-80 MiB RSS for a daemon with every backend loaded, before any cache fills)
RESERVE = 96 << 20
#: Metadata files are parsed whole at mount time and kept; json.loads takes up to ~40 bytes
#: per input byte (37.4 for 20-deep one-entry objects, 25 for `[{},{},...]`: measured in
#: formats/jsonfile.py, whose estimate of it `max_metadata` bounds). A quarter of the budget
#: lets a real file of up to ~7 MiB through at the default 256M (a consolidated zarr.json of
#: ~4,000 arrays; real metadata is estimated at ~9 bytes per byte) and keeps the worst one
#: under 16 MiB with memory=64M: the 28 MiB `[{},{},...]` of issue 22 (768 MiB parsed) is
#: refused after 16 MiB are read, a 1 MiB one (~25 MiB parsed) before parsing.
METADATA_SHARE = 4


def resolve_caches(opts: MountOptions) -> MountOptions:
    """Fill in the cache sizes not given explicitly from the memory budget."""
    share = max(8 << 20, opts.memory - RESERVE)
    if opts.index_cache is None:
        opts.index_cache = share // 4
    if opts.block_cache is None:
        opts.block_cache = share // 2
    if opts.decoded_cache is None:
        opts.decoded_cache = share // 4
    if opts.max_metadata is None:
        opts.max_metadata = opts.memory // METADATA_SHARE
    return opts


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def parse_options(groups: list[str], opts: MountOptions | None = None) -> MountOptions:
    """Parse `-o` values (each a comma-separated list) into MountOptions."""
    opts = opts or MountOptions()
    for group in groups:
        for item in filter(None, (s.strip() for s in group.split(","))):
            name, has_value, value = item.partition("=")
            if name in GENERIC or name.startswith("x-") or name == "comment":
                opts.ignored.append(item)
                continue
            if name == "rw":
                logging.getLogger("zvfs").warning("zvfs is read-only: ignoring 'rw'")
                continue
            if name not in OWN:
                raise OptionError(f"unknown mount option '{name}' (see 'zvfs mount --help')")
            attr, kind, _ = OWN[name]
            if kind == "flag":
                if has_value:
                    raise OptionError(f"mount option '{name}' takes no value")
                setattr(opts, attr, True)
                continue
            if not has_value or not value:
                raise OptionError(f"mount option '{name}' needs a value ({name}=...)")
            try:
                if kind in ("view", "n5c"):
                    if value not in (VIEWS if kind == "view" else N5_COMPRESSIONS):
                        raise ValueError(value)
                    parsed = View(value) if kind == "view" else value
                elif kind == "size":
                    parsed = parse_size(value)
                elif kind == "int":
                    parsed = int(value)
                    if parsed < 1:
                        raise ValueError(value)
                elif kind == "float":
                    parsed = float(value)
                    if not parsed > 0:
                        raise ValueError(value)
                elif kind in ("uid", "gid"):
                    parsed = _id_of(kind, value)
                elif kind == "octal":
                    parsed = int(value, 8)
                    if not 0 <= parsed <= 0o777:
                        raise ValueError(value)
                else:
                    parsed = value
            except ValueError:
                choices = {"view": VIEWS, "n5c": N5_COMPRESSIONS}.get(kind)
                choices = f" (one of: {', '.join(choices)})" if choices else ""
                raise OptionError(f"bad value for mount option '{name}': {value!r}{choices}") from None
            setattr(opts, attr, parsed)
    return resolve_caches(opts)


def _id_of(kind: str, value: str) -> int:
    """A user or group given by number or by name (as fstab lines usually say it)."""
    if value.isdigit():
        return int(value)
    import grp
    import pwd

    try:
        return pwd.getpwnam(value).pw_uid if kind == "uid" else grp.getgrnam(value).gr_gid
    except KeyError:
        raise ValueError(value) from None


def storage_options(protocol: str, opts: MountOptions) -> dict:
    """fsspec arguments for a backend; credentials come from the backend's usual environment
    variables and files (AWS_ACCESS_KEY_ID, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, ...)."""
    out: dict = {}
    if protocol in ("s3", "s3a"):
        client: dict = {}
        # one attempt per call and our own retries: the deadline stays ours
        out["config_kwargs"] = {"connect_timeout": opts.request_timeout, "read_timeout": opts.request_timeout,
                                "retries": {"max_attempts": 1}}
        if opts.endpoint:
            out["endpoint_url"] = opts.endpoint
        if opts.region:
            client["region_name"] = opts.region
        if opts.profile:
            out["profile"] = opts.profile
        if opts.anon:
            out["anon"] = True
        if client:
            out["client_kwargs"] = client
    elif protocol in ("gs", "gcs"):
        # gcsfs's own retry loop (6 attempts, up to 32 s sleeps) cannot be switched off: each of
        # its requests gets our timeout, and zvfs cuts the whole call at the deadline
        out["requests_timeout"] = opts.request_timeout
        if opts.endpoint:
            out["endpoint_url"] = opts.endpoint
        if opts.anon:
            out["token"] = "anon"
        elif opts.endpoint:
            out["token"] = gcs_credentials_for_endpoint()
    elif opts.endpoint or opts.region or opts.profile or opts.anon:
        raise OptionError(f"options endpoint/region/profile/anon do not apply to {protocol}:// sources")
    elif protocol in ("http", "https"):
        import aiohttp

        out["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=opts.request_timeout)}
    return out


def gcs_credentials_for_endpoint() -> str:
    """gcsfs's credential method for a gs:// store at `endpoint`: Google's application default
    credentials when a file holds them (GOOGLE_APPLICATION_CREDENTIALS, else the file of
    `gcloud auth application-default login`), else anonymous. gcsfs's own lookup
    (google.auth.default) goes on, when no file holds credentials, to ask the cloud metadata
    server (169.254.169.254) whether it runs on Google's cloud: measured, one request off the
    machine for each `zvfs ls` of an emulator on loopback."""
    import os

    from google.auth import _cloud_sdk, environment_vars

    found = os.environ.get(environment_vars.CREDENTIALS) or os.path.exists(
        _cloud_sdk.get_application_default_credentials_path())
    return "google_default" if found else "anon"


def options_help() -> str:
    return "\n".join(f"  {name:<16} {text}" for name, (_, _, text) in OWN.items())
