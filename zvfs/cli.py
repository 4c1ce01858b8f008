"""The `zvfs` command and the `mount.zvfs` helper.

`zvfs ls`/`cat`/`inspect` walk the same virtual tree a mount shows, without FUSE. mount(8)
with `-t fuse.zvfs` runs `zvfs SOURCE DIR -o OPTS` through mount.fuse3, so a first argument
that is not a command is read as `zvfs mount`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import trio

from . import report
from .daemon import ARGV_ENV, run_foreground, spawn_daemon
from .errors import CorruptShardError, OptionError, StorageError, ZvfsError
from .options import MountOptions, options_help, parse_options
from .source import open_source

COMMANDS = ("mount", "umount", "ls", "cat", "inspect")

DESCRIPTION = """\
zvfs shows a sharded chunked store (Zarr v3 with sharding_indexed, Neuroglancer precomputed
with neuroglancer_uint64_sharded_v1, ZVF) as its unsharded equivalent: one file per inner
chunk, metadata rewritten, bytes passed through; also as N5 or Zarr v2 (--view). Read-only.
SOURCE is a local path or an fsspec URL (http(s)://, s3://, gs://, ...)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zvfs", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    m = sub.add_parser(
        "mount", help="mount SOURCE on MOUNTPOINT (returns once the mount is live)",
        description="Mount SOURCE read-only on MOUNTPOINT and return once the mount is live.",
        epilog="mount options (-o):\n" + options_help() + "\n\nGeneric mount(8) options (ro, noatime, nofail, _netdev, x-*, ...) are accepted and ignored.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _source_args(m)
    m.add_argument("mountpoint", metavar="MOUNTPOINT")
    m.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground and log to stderr (for systemd)")

    u = sub.add_parser("umount", help="unmount a zvfs mount", description="Unmount a zvfs mount point.")
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.add_argument("-z", "--lazy", action="store_true", help="detach now, finish when no longer busy")

    ls = sub.add_parser("ls", help="list a directory of the virtual tree without mounting",
                        description="List PATH in the virtual tree of SOURCE (directories end in '/').")
    _source_args(ls)
    ls.add_argument("path", metavar="PATH", nargs="?", default="")
    ls.add_argument("-l", "--long", action="store_true", help="show sizes")

    cat = sub.add_parser("cat", help="write a virtual file to stdout without mounting",
                         description="Write the bytes of PATH in the virtual tree of SOURCE to stdout.")
    _source_args(cat)
    cat.add_argument("path", metavar="PATH")

    ins = sub.add_parser("inspect", help="describe the arrays of a store and their shards",
                         description="Per array: shape, dtype, shard and inner chunk shape, codecs, shards and chunks present, bytes.")
    _source_args(ins)
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _source_args(p: argparse.ArgumentParser) -> None:
    """SOURCE and the options that shape its tree, shared by ls, cat and inspect."""
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--view", help="view to show (default: zarr for Zarr stores)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT=V...]", help="options as for mount")


def _fail(message: str, status: int = 2) -> int:
    print(f"zvfs: {message}", file=sys.stderr)
    return status


def _mount_options(args) -> MountOptions:
    opts = parse_options(args.options)
    if args.view:
        opts = parse_options([f"view={args.view}"], opts)
    return opts


def cmd_mount(args, argv: list[str]) -> int:
    opts = _mount_options(args)
    mountpoint = os.path.abspath(args.mountpoint)
    if args.foreground:
        return run_foreground(args.source, mountpoint, opts)
    child_argv = ["mount", args.source, mountpoint, *[a for o in args.options for a in ("-o", o)]]
    if args.view:
        child_argv += ["--view", args.view]
    status, error = spawn_daemon(args.source, mountpoint, child_argv, opts)
    if error:
        return _fail(error, status or 1)
    return 0


def cmd_umount(args) -> int:
    cmd = ["fusermount3", "-u" + ("z" if args.lazy else ""), args.mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode == 0:
        return 0
    err = res.stderr.strip()
    if "busy" in err.lower():
        return _fail(f"{args.mountpoint}: mount point is busy (files open or a shell inside); retry later or use 'zvfs umount --lazy'", 1)
    if "not found in /etc/mtab" in err or "not mounted" in err.lower():
        return _fail(f"{args.mountpoint}: not mounted", 1)
    return _fail(err.splitlines()[-1] if err else f"fusermount3 exited with status {res.returncode}", 1)


async def _ls(args) -> int:
    src = await open_source(args.source, _mount_options(args))
    try:
        node = await src.tree.resolve(args.path)
        if node is None:
            return _fail(f"{args.path}: no such file or directory", 1)
        entries = await node.entries() if node.is_dir else [(args.path.rstrip("/").rsplit("/", 1)[-1], node)]
        out = []
        for name, child in entries:
            if args.long:
                size = 0 if child.is_dir else await child.size()
                out.append(f"{size:>12} {name}{'/' if child.is_dir else ''}")
            else:
                out.append(name + ("/" if child.is_dir else ""))
        if out:
            print("\n".join(out))
        return 0
    finally:
        await src.store.aclose()


async def _cat(args) -> int:
    src = await open_source(args.source, _mount_options(args))
    try:
        node = await src.tree.resolve(args.path)
        if node is None:
            return _fail(f"{args.path}: no such file or directory", 1)
        if node.is_dir:
            return _fail(f"{args.path}: is a directory", 1)
        size, step, out = await node.size(), 1 << 20, sys.stdout.buffer
        for off in range(0, size, step):
            out.write(await node.read(off, step))
        out.flush()
        return 0
    finally:
        await src.store.aclose()


async def _inspect(args) -> int:
    src = await open_source(args.source, _mount_options(args))
    try:
        described = await report.describe(src)
        print(json.dumps(described, indent=2) if args.json else report.render(described))
        return 0
    finally:
        await src.store.aclose()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if ARGV_ENV in os.environ:  # a daemon started by `zvfs mount`: its real arguments
        argv = json.loads(os.environ.pop(ARGV_ENV))
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        argv = ["mount", *_strip_helper_flags(argv)]
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "mount":
            return cmd_mount(args, argv)
        if args.command == "umount":
            return cmd_umount(args)
        return trio.run({"ls": _ls, "cat": _cat, "inspect": _inspect}[args.command], args)
    except OptionError as e:
        return _fail(str(e))
    except (CorruptShardError, StorageError) as e:
        return _fail(str(e), 1)
    except ZvfsError as e:
        return _fail(str(e))
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


def _strip_helper_flags(argv: list[str]) -> list[str]:
    """mount(8)/mount.fuse3/systemd add -n (no mtab), -s (sloppy), -v (verbose): ignore them."""
    return [a for a in argv if a not in ("-n", "-s", "-v")]


def mount_helper_main() -> int:
    """`mount.zvfs SOURCE DIR [-o OPTS] [-n] [-s] [-v] [-f]`, as mount(8) calls helpers."""
    return main(["mount", *_strip_helper_flags(sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
