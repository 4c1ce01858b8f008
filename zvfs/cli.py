"""The `zvfs` command and the `mount.zvfs` helper.

`zvfs ls`/`cat`/`inspect` walk the same virtual tree a mount shows, without FUSE. Each command
loads the layers it uses when it runs: `zvfs mount` (the front end), `umount`, `stats`,
`refresh` and `doctor` start without trio, pyfuse3, numpy, shtab or the formats (45 ms of
imports instead of 480; every mount runs one such process besides the daemon, and unmounting
another).

The bare form `zvfs SOURCE MOUNTPOINT -o OPTS` exists because mount(8) with `-t fuse.zvfs`
(and fstab) runs it through mount.fuse3. It is taken as a mount only when the first argument is
not a command, looks like a source (contains '/', which every URL and absolute path does, or
names an existing path) and a second non-option argument follows; anything else that is not a
command is an error naming it ("unknown command 'mout'"), so a mistyped command never mounts.

Credentials: a source URL with a password or a signed query string must not stay in any
process's argv (`ps` shows it to every local user). When an argument holds one, the process
re-executes itself at once with the URL redacted in argv and the real arguments in the
environment (readable by the same user only), keeping its pid (systemd's main process).

Exit statuses follow one rule (`EXIT_STATUSES`, also in the man page and the README): 2 when
zvfs refuses before doing anything (the command line, an option, a SOURCE that does not open, a
MOUNTPOINT it will not mount on), 1 when the work itself fails; every failure is one line. A
reader that goes away (`zvfs inspect S | head`) ends the command quietly with 141, as it ends
`cat` (killed by SIGPIPE: 128+13), so `set -o pipefail` scripts see what they see for any tool.
As a mount helper (`mount.zvfs`, or the bare form above, which only mount.fuse3 uses),
mount(8)'s codes: 1 usage, 8 interrupted, 32 mount failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import stat
import sys

from .errors import (
    CorruptShardError,
    MetadataError,
    OptionError,
    StorageError,
    ZvfsError,
)
from .fronts.mounting import (
    ARGV_ENV,
    FSTYPE,
    check_log_target,
    check_mountpoint,
    fusermount,
    mount_at,
    shown,
    spawn_daemon,
)
from .names import View
from .options import GENERIC, OWN, MountOptions, options_help, parse_options

COMMANDS = ("mount", "umount", "serve", "ls", "cat", "inspect", "stats", "refresh", "cache", "doctor")

#: hidden control files the daemon answers at the mount root (found by name only, never listed)
STATS_FILE = ".zvfs.stats"
REFRESH_FILE = ".zvfs.refresh"

#: the PATH mount.fuse3 gives the helper it runs (`/bin/sh -c 'zvfs ...'`), and where mount(8)
#: looks for `mount.zvfs`
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MOUNT_HELPER = "/sbin/mount.zvfs"

#: inspect --strict: the store has bad shards (distinct from 1, a failure to inspect at all)
STRICT_PROBLEMS = 3
#: the reader of our output went away: what a shell reports for a tool killed by SIGPIPE
PIPE_CLOSED = 128 + 13

EXIT_STATUSES = (
    ("0", "success"),
    ("1", "the work failed: a read or the backend failed after SOURCE opened, a PATH not in the tree (ls, cat), the "
          "kernel refused the mount, a mount that is busy, not mounted or not zvfs's (umount, stats, refresh), doctor "
          "found a problem"),
    ("2", "refused before doing anything: a usage error or unknown option, a SOURCE that does not open (missing, "
          "unreachable, not a store, bad metadata), a MOUNTPOINT zvfs will not mount on (missing, not a directory, "
          "already mounted, the source or inside or above it, holding files without -o nonempty)"),
    (str(STRICT_PROBLEMS), "inspect --strict found damaged shards"),
    ("128+N", f"interrupted by signal N; {PIPE_CLOSED} (SIGPIPE) when the reader of the output went away (| head), "
              "with no message"),
    ("mount helper", "as mount.zvfs, or in the form mount.fuse3 runs, mount(8)'s codes instead: 1 usage, "
                     "8 interrupted, 32 mount failure"),
)

#: the metavariable of each kind of -o value (options.OWN), for the man page
_OPTION_VALUES = {"size": "SIZE", "int": "N", "float": "SECONDS", "str": "VALUE", "view": "VIEW", "n5c": "COMPRESSION",
                  "uid": "USER", "gid": "GROUP", "octal": "MASK"}

#: the man page's NAME line (whatis, apropos)
SUMMARY = "show sharded Zarr v3, Neuroglancer precomputed and ZVF stores as unsharded one-file-per-chunk trees (FUSE)"

DESCRIPTION = """\
zvfs shows a sharded chunked store (Zarr v3 with sharding_indexed, Neuroglancer precomputed
with neuroglancer_uint64_sharded_v1, ZVF) as its unsharded equivalent: one file per inner
chunk, metadata rewritten, bytes passed through; also as N5 or Zarr v2 (--view). Read-only.
SOURCE is a local path or an fsspec URL (http(s)://, s3://, gs://, ...); prefer credential
files or environment variables over passwords in URLs."""

EPILOG = """\
mount(8) runs `zvfs SOURCE MOUNTPOINT -o OPTS` for `-t fuse.zvfs` and fstab: that form mounts
when SOURCE contains '/' (or exists) and MOUNTPOINT follows."""


class UsageError(ZvfsError):
    """A command line zvfs cannot run: one line, exit 2 (1 as a mount helper)."""


class _Parser(argparse.ArgumentParser):
    """argparse that fails with one line (usage errors are one line like every other failure)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def print_help(self, file=None):
        """Help written here: argparse's own drops write errors, so `zvfs --help | head` ended 0
        instead of as every other command into a closed pipe (141, see main)."""
        (file or sys.stdout).write(self.format_help())


class _PrintManPage(argparse.Action):
    """`--print-man`: the man page, generated from this very parser (argparse-manpage), with the
    sections a parser does not hold: the -o options (options.OWN), the exit statuses."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the man page (roff) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from argparse_manpage.manpage import Manpage

        from . import __version__

        data = {"version": __version__, "project_name": "zvfs", "manual_section": "1", "manual_title": "zvfs manual",
                "description": SUMMARY}
        page = Manpage(parser, _data=data)
        options = [_tagged(f"\\fB{name}\\fR" + ("" if kind == "flag" else f"=\\fI{_OPTION_VALUES[kind]}\\fR"), text)
                   for name, (_, kind, text) in OWN.items()]
        generic = ", ".join(sorted(GENERIC)) + ", x-*, comment"
        page.add_section("mount options", "=", "\n".join([
            _roff("Given with -o (comma-separated) to mount, ls, cat and inspect, and in fstab."), *options, ".PP",
            _roff(f"Generic mount(8) options are accepted and have no effect (zvfs is always read-only): {generic}. "
                  "Anything else is refused with a message naming it.")]))
        page.add_section("exit status", "=", "\n".join(_tagged(_roff(code), text) for code, text in EXIT_STATUSES))
        page.add_section("see also", "=", "mount(8), fstab(5), fusermount3(1), mount.fuse3(8)")
        print(page)
        parser.exit()


def _roff(text: str) -> str:
    """Text for a roff line (argparse-manpage's own escaping: backslashes, and '-' as a minus)."""
    return text.replace("\\", "\\\\").replace("-", "\\-")


def _tagged(tag: str, text: str) -> str:
    """One .TP entry: a tag (roff already) and its paragraph."""
    return f".TP\n{tag}\n{_roff(text)}"


def _option_completion() -> dict:
    """shtab's completion of -o: the option names (flags bare, the others with '='), after a
    comma too (`-o ro,all<TAB>` gives `ro,allow_other`)."""
    words = " ".join(n if kind == "flag" else f"{n}=" for n, (_, kind, _) in OWN.items())
    bash = (f'_zvfs_mount_options() {{\n  local head=""\n  [[ "$1" == *,* ]] && head="${{1%,*}},"\n'
            f'  compgen -P "$head" -W "{words}" -- "${{1##*,}}"\n}}\n')
    return {"bash": "_zvfs_mount_options", "zsh": f"({words})", "preamble": {"bash": bash}}


class _PrintCompletion(argparse.Action):
    """`--print-completion SHELL`: shtab's completion script for this parser. (shtab is loaded
    here, not at start: it costs 35 ms of every zvfs process.)"""

    SHELLS = ("bash", "zsh", "tcsh")

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, metavar="SHELL", choices=self.SHELLS,
                         help=f"print a shell completion script ({', '.join(self.SHELLS)}) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        import shtab

        for action in _actions(parser):
            if getattr(action, "completes_directory", False):
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
        print(shtab.complete(parser, values))
        parser.exit()


def _actions(parser: argparse.ArgumentParser):
    """Every argument of the parser and its subcommands."""
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)


class _PrintSamplePath(argparse.Action):
    """`--sample-path`: where the sample store shipped in the package is. The installed `zvfs`
    is the one reliable way to say it: `import zvfs` in some other Python finds another zvfs, or
    none, or a checkout directory named zvfs (a namespace package, without SAMPLE_STORE)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the path of the sample store shipped with zvfs and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from . import SAMPLE_STORE

        if not os.path.isfile(os.path.join(SAMPLE_STORE, "zarr.json")):
            parser.exit(1, f"zvfs: {SAMPLE_STORE}: the sample store is not installed\n")
        print(SAMPLE_STORE)
        parser.exit()


class _PrintVersion(argparse.Action):
    """`--version`, looked up only when asked for."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__

        print(f"zvfs {__version__}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="zvfs", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_PrintVersion)
    p.add_argument("--print-completion", action=_PrintCompletion)
    p.add_argument("--print-man", action=_PrintManPage)
    p.add_argument("--sample-path", action=_PrintSamplePath)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    m = sub.add_parser(
        "mount", help="mount SOURCE on MOUNTPOINT (returns once the mount is live)",
        description="Mount SOURCE read-only on MOUNTPOINT and return once the mount is live.",
        epilog="mount options (-o):\n" + options_help() + "\n\nGeneric mount(8) options (ro, noatime, nofail, _netdev, x-*, ...) are accepted and ignored.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _source_args(m)
    _mountpoint_arg(m)
    m.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground and log to stderr (for systemd)")

    u = sub.add_parser("umount", help="unmount a zvfs mount", description="Unmount a zvfs mount point (and only a zvfs one).")
    _mountpoint_arg(u)
    u.add_argument("-z", "--lazy", action="store_true", help="detach now, finish when no longer busy")

    sv = sub.add_parser("serve", help="serve the view of SOURCE over HTTP (for readers that cannot mount)",
                        description="Serve the view of SOURCE over HTTP until SIGTERM or SIGINT: GET and HEAD of every "
                                    "file (Range, ETag, conditional requests), directories as JSON or HTML, "
                                    "/.zvfs/ready, /.zvfs/health, /.zvfs/metrics (Prometheus) and /.zvfs/stats. Only what "
                                    "the store lets everyone read is served. Prints its URL once it listens.")
    _source_args(sv)
    sv.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8080",
                    help="address to listen on (default: 127.0.0.1:8080; port 0 picks a free one)")
    sv.add_argument("--cors", metavar="ORIGIN", action="append", default=[],
                    help="let web pages of ORIGIN read (repeatable; '*' for any). Default: none, since every page "
                         "a browser opens could otherwise read what this server serves")
    sv.add_argument("--max-age", metavar="SECONDS", type=int, default=0,
                    help="seconds HTTP caches may keep a file without asking again (default 0: they revalidate, "
                         "answered 304 while unchanged)")
    sv.add_argument("--workers", metavar="N", type=int, default=1,
                    help="serve from N processes (default 1: one answers about a core's worth of requests); each "
                         "opens the source and has its own caches, -o memory budget and counters")
    sv.add_argument("--no-access-log", dest="access_log", action="store_false", help="do not log each request")
    sv.add_argument("--drain", metavar="SECONDS", type=float, default=30.0,
                    help="on SIGTERM or SIGINT, seconds requests in flight get to finish before their connections "
                         "are closed (default 30; below the supervisor's own limit: systemd's TimeoutStopSec, "
                         "Kubernetes' terminationGracePeriodSeconds)")

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
                         description="Per array: shape, dtype, shard and inner chunk shape, codecs, shards and chunks present, "
                                     "bytes, and the shards that are damaged (listed in the array's section; inspect goes on).")
    _source_args(ins)
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--strict", action="store_true", help=f"exit with status {STRICT_PROBLEMS} when a shard is damaged")

    st = sub.add_parser("stats", help="live counters of a mount",
                        description="Files read, bytes served, backend requests and bytes, retries, EIO answers, caches.")
    _mountpoint_arg(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")

    rf = sub.add_parser("refresh", help="drop a mount's caches (after the store changed)",
                        description="Drop the caches of a mount and invalidate the kernel's entries, so the next reads see the store as it is now.")
    _mountpoint_arg(rf)

    ca = sub.add_parser("cache", help="show or clear a disk cache (-o cache_dir=DIR)",
                        description="Entries and bytes of the disk cache in DIR (-o cache_dir=DIR), and the bytes its files "
                                    "take; --clear empties it (mounts using it go on, reading from the store).")
    ca.add_argument("directory", metavar="DIR").completes_directory = True
    ca.add_argument("--clear", action="store_true", help="drop every entry")
    ca.add_argument("--json", action="store_true", help="machine-readable output")

    sub.add_parser("doctor", help="check that this machine can mount zvfs (and say what to fix)",
                   description="Check fuse3 (fusermount3, mount.fuse3), /dev/fuse, user_allow_other in /etc/fuse.conf "
                               "and the helpers mount(8) runs (zvfs on the standard PATH, /sbin/mount.zvfs).")
    return p


def _source_args(p: argparse.ArgumentParser) -> None:
    """SOURCE and the options that shape its tree, shared by mount, ls, cat and inspect."""
    p.add_argument("source", metavar="SOURCE").completes_directory = True
    p.add_argument("--view", choices=tuple(View), metavar="VIEW",
                   help=f"view to show: {', '.join(View)} (default: the store kind's own; "
                        "`zvfs inspect` lists the views a store has)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT=V...]",
                   help="options as for mount (see MOUNT OPTIONS)").complete = _option_completion()


def _mountpoint_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("mountpoint", metavar="MOUNTPOINT").completes_directory = True


def _fail(message: str, status: int = 2) -> int:
    print("\n".join(f"zvfs: {line}" for line in message.splitlines()), file=sys.stderr)
    return status


def _mount_options(args) -> MountOptions:
    opts = parse_options(args.options)
    if args.view:
        opts = parse_options([f"view={args.view}"], opts)
    return opts


# --------------------------------------------------------------------------- credentials


def _hide_credentials(argv: list[str], helper: bool) -> None:
    """Re-execute with credentials out of this process's argv (see the module docstring);
    returns only when there are none."""
    if all(shown(a) == a for a in sys.argv[1:]):
        return
    title = [shown(a) for a in argv]
    env = {**os.environ, ARGV_ENV: json.dumps({"argv": argv, "helper": helper})}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "zvfs", *title], env)


# --------------------------------------------------------------------------- mount and umount


def cmd_mount(args) -> int:
    opts = _mount_options(args)
    check_log_target(opts)
    # the daemon runs in /, so every path it is given is absolute
    source = args.source if "://" in args.source else os.path.abspath(args.source)
    mountpoint = os.path.abspath(args.mountpoint)
    if opts.log_file:
        opts.log_file = os.path.abspath(opts.log_file)
    check_mountpoint(mountpoint, source, opts)
    if args.foreground:
        from .fronts.fuse_daemon import run_foreground

        return run_foreground(source, mountpoint, opts)
    child_argv = ["mount", source, mountpoint, *[a for o in args.options for a in ("-o", o)], "--foreground"]
    if opts.log_file:
        child_argv += ["-o", f"log={opts.log_file}"]
    if args.view:
        child_argv += ["--view", args.view]
    env = {ARGV_ENV: json.dumps({"argv": child_argv, "helper": False})}
    status, error = spawn_daemon(source, mountpoint, opts, env)
    return _fail(error, status or 1) if error else 0


def cmd_serve(args) -> int:
    from .fronts.serve import run

    if args.max_age < 0:
        raise UsageError("--max-age: must be 0 or more")
    if not 0 <= args.drain < float("inf"):
        raise UsageError("--drain: must be 0 or more seconds")
    if not 1 <= args.workers <= 1024:
        raise UsageError("--workers: must be 1 to 1024")
    return run(args.source, _mount_options(args), args.listen, args.cors, args.max_age, args.access_log, args.drain,
               args.workers)


def _zvfs_mount_point(path: str) -> str:
    """The mount point of the zvfs mount at `path` (from the mount table, never a stat)."""
    mounted = mount_at(path)
    if mounted is None:
        raise StorageError(f"{path}: not mounted")
    if mounted.fstype != FSTYPE:
        raise StorageError(f"{path}: not a zvfs mount ({mounted.fstype} from {mounted.source}); zvfs leaves it alone")
    return mounted.point


def cmd_umount(args) -> int:
    point = _zvfs_mount_point(args.mountpoint)
    res = fusermount("-u" + ("z" if args.lazy else ""), point)
    if res.returncode == 0:
        return 0
    err = res.stderr.strip()
    if "busy" in err.lower():
        return _fail(f"{args.mountpoint}: mount point is busy (files open or a shell inside); retry later or use 'zvfs umount --lazy'", 1)
    return _fail(err.splitlines()[-1] if err else f"fusermount3 exited with status {res.returncode}", 1)


# --------------------------------------------------------------------------- stats and refresh


def _control(point: str, name: str) -> dict:
    """Read one of the daemon's control files (a JSON object)."""
    try:
        with open(os.path.join(point, name), "rb") as f:
            raw = f.read()
    except OSError as e:
        if e.errno == 107:  # ENOTCONN
            raise StorageError(f"{point}: the daemon is gone (stale mount); clear it with 'zvfs umount {point}'") from None
        raise StorageError(f"{point}: cannot read {name} ({e.strerror}); is its daemon older than this zvfs?") from None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise StorageError(f"{point}: {name} is not a JSON object")
    return value


def _stats_table(stats: dict, point: str) -> str:
    counters = ("files_read", "bytes_served", "pushed", "bytes_pushed", "changed", "backend_requests", "backend_bytes",
                "retries", "eio")
    lines = [f"{point}: zvfs {stats.get('zvfs_version', '?')}",
             f"  {'source':<18} {stats.get('source', '?')}", f"  {'view':<18} {stats.get('view', '?')}"]
    lines += [f"  {name.replace('_', ' '):<18} {stats[name]:>14}" for name in counters if name in stats]
    caches = stats.get("caches") or {}
    if caches:
        lines.append(f"  {'cache':<18} {'hits':>14} {'misses':>10} {'bytes':>14}")
        for name, c in caches.items():
            lines.append(f"  {name:<18} {c.get('hits', 0):>14} {c.get('misses', 0):>10} {c.get('bytes', 0):>14}")
    return "\n".join(lines)


def cmd_stats(args) -> int:
    point = _zvfs_mount_point(args.mountpoint)
    stats = _control(point, STATS_FILE)
    print(json.dumps(stats, indent=2) if args.json else _stats_table(stats, point))
    return 0


def cmd_refresh(args) -> int:
    point = _zvfs_mount_point(args.mountpoint)
    if _control(point, REFRESH_FILE).get("refreshed") is not True:
        raise StorageError(f"{point}: the daemon did not confirm the refresh")
    print(f"{point}: caches dropped")
    return 0


def cmd_cache(args) -> int:
    import sqlite3

    from .storage.diskcache import DB_NAME, DiskCache, damaged

    if not os.path.exists(os.path.join(args.directory, DB_NAME)):
        raise MetadataError(args.directory, "no disk cache here (made by -o cache_dir=DIR)")
    if args.clear:
        try:
            DiskCache(args.directory).close()
        except sqlite3.Error as e:
            if not damaged(e):
                raise StorageError(f"{args.directory}: {e}") from None
            DiskCache.remove(args.directory)  # (made anew below)
    try:
        cache = DiskCache(args.directory)
        try:
            if args.clear:
                cache.clear()
            summary = cache.summary()
        finally:
            cache.close()
    except sqlite3.Error as e:
        raise StorageError(f"{args.directory}: {e} (remove the directory to start anew)") from None
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['directory']}: {summary['entries']} entries, {summary['bytes']} bytes cached, "
              f"{summary['on_disk']} bytes on disk{' (cleared)' if args.clear else ''}")
    return 0


# --------------------------------------------------------------------------- doctor


def _doctor_checks() -> list[tuple[bool, str, str]]:
    """(fine, what was checked, what to do about it)."""
    out = []
    root = os.geteuid() == 0
    fusermount = shutil.which("fusermount3", path=STANDARD_PATH)
    setuid = fusermount is not None and bool(os.stat(fusermount).st_mode & stat.S_ISUID)
    out.append((fusermount is not None and (root or setuid),
                f"fusermount3 (users mount through it): {fusermount or 'missing'}{'' if setuid or not fusermount else ', not set-uid root'}",
                "install fuse3 (apt-get install fuse3); users need it set-uid root (chmod u+s)"))
    helper = shutil.which("mount.fuse3", path=STANDARD_PATH)
    out.append((helper is not None, f"mount.fuse3 (mount -t fuse.zvfs, fstab): {helper or 'missing'}", "install fuse3 (apt-get install fuse3)"))
    try:
        st = os.stat("/dev/fuse")
        if not stat.S_ISCHR(st.st_mode):
            raise OSError(0, "not a character device")
        os.close(os.open("/dev/fuse", os.O_RDWR))
        out.append((True, "/dev/fuse: usable", ""))
    except OSError as e:
        out.append((False, f"/dev/fuse: {e.strerror}",
                    "load the fuse module (modprobe fuse); in a container pass the device (--device /dev/fuse); "
                    "as a user, /dev/fuse must be readable and writable by you"))
    try:
        with open("/etc/fuse.conf") as f:
            allow = any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        allow = False
    out.append((allow or root, "user_allow_other in /etc/fuse.conf: " + ("yes" if allow else "no (root does not need it)" if root else "no"),
                "add a line 'user_allow_other' to /etc/fuse.conf (as root) to use -o allow_other as a user"))
    here = shutil.which("zvfs") or os.path.join(os.path.dirname(sys.executable), "zvfs")
    std = shutil.which("zvfs", path=STANDARD_PATH)
    out.append((std is not None, f"zvfs on the standard PATH (mount.fuse3 runs it): {std or 'missing'}",
                f"ln -s {here} /usr/local/bin/zvfs"))
    ok = os.access(MOUNT_HELPER, os.X_OK)
    out.append((ok, f"{MOUNT_HELPER} (mount -t zvfs): {'present' if ok else 'missing'}",
                f"ln -s {os.path.join(os.path.dirname(here), 'mount.zvfs')} {MOUNT_HELPER}"))
    return out


def cmd_doctor(args) -> int:
    problems = 0
    for fine, what, fix in _doctor_checks():
        print(f"{'ok' if fine else 'MISSING':<8} {what}" + ("" if fine else f"\n         fix: {fix}"))
        problems += not fine
    if problems:
        print(f"{problems} problem(s): zvfs cannot mount (or mount(8) cannot run it) until they are fixed", file=sys.stderr)
    return 1 if problems else 0


# --------------------------------------------------------------------------- without mounting


async def _open(args):
    """The source of `ls`, `cat` and `inspect`, or a refusal as `mount` refuses it: anything that
    keeps a source from opening (missing, unreachable, not a store, bad metadata) is exit 2, so
    `zvfs inspect URL` and `zvfs mount URL DIR` agree. (The daemon words it the same way.)"""
    from .core.source import open_source

    try:
        return await open_source(args.source, _mount_options(args))
    except StorageError as e:  # the backend's own words, as a refusal
        raise ZvfsError(str(e)) from None
    except (OSError, ValueError) as e:
        text = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0] if str(e) else type(e).__name__
        raise MetadataError(shown(args.source), f"cannot open: {shown(text)}") from None


async def _ls(args) -> int:
    from .core.paths import Paths

    src = await _open(args)
    try:
        paths = Paths(src)
        try:
            found = await paths.stat(args.path)
            entries = await paths.listdir(args.path) if found.is_dir else [found]
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return _fail(f"{args.path}: no such file or directory", 1)
        out = []
        for entry in entries:
            name = entry.name + ("/" if entry.is_dir else "")
            if args.long:
                size = entry.size
                if size is None:  # (not known from the listing: the file says)
                    size = (await paths.stat(f"{args.path}/{entry.name}")).size
                out.append(f"{size:>12} {name}")
            else:
                out.append(name)
        if out:
            print("\n".join(out))
        return 0
    finally:
        await src.store.aclose()


async def _cat(args) -> int:
    from .core.paths import Paths

    src = await _open(args)
    try:
        try:
            opened = await Paths(src).open(args.path)  # a snapshot, as a mount's open
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return _fail(f"{args.path}: no such file or directory", 1)
        except IsADirectoryError:
            return _fail(f"{args.path}: is a directory", 1)
        async with opened:
            step, out = 1 << 20, sys.stdout.buffer
            for off in range(0, opened.size, step):
                out.write(await opened.read(off, step))
            out.flush()
        return 0
    finally:
        await src.store.aclose()


async def _inspect(args) -> int:
    from . import report

    logging.getLogger("zvfs").setLevel(logging.ERROR)  # damaged shards are in the report, not logged twice
    src = await _open(args)
    try:
        described = await report.describe(src)
        print(json.dumps(described, indent=2) if args.json else report.render(described))
        return STRICT_PROBLEMS if args.strict and report.problems(described) else 0
    finally:
        await src.store.aclose()


# --------------------------------------------------------------------------- entry points


def _is_bare_mount(argv: list[str]) -> bool:
    """`zvfs SOURCE MOUNTPOINT ...` as mount.fuse3 runs it (see the module docstring)."""
    return (len(argv) >= 2 and argv[0] not in COMMANDS and not argv[0].startswith("-") and not argv[1].startswith("-")
            and ("/" in argv[0] or os.path.exists(argv[0])))


def _strip_helper_flags(argv: list[str]) -> list[str]:
    """mount(8)/mount.fuse3/systemd add -n (no mtab), -s (sloppy), -v (verbose), -t TYPE (ours)
    and -N NAMESPACE (unused): drop them."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-t", "-N"):
            skip = True
        elif a not in ("-n", "-s", "-v"):
            out.append(a)
    return out


def _run(argv: list[str]) -> int:
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        raise UsageError(f"unknown command '{shown(argv[0])}' (commands: {', '.join(COMMANDS)}; see 'zvfs --help')")
    args = _parser().parse_args(argv)
    where = shown(getattr(args, "source", None) or getattr(args, "mountpoint", None) or "zvfs")
    try:
        if args.command in ("mount", "umount", "serve", "stats", "refresh", "cache", "doctor"):
            return globals()[f"cmd_{args.command}"](args)
        import trio

        return trio.run({"ls": _ls, "cat": _cat, "inspect": _inspect}[args.command], args)
    except OptionError as e:
        raise UsageError(str(e)) from None
    except (CorruptShardError, StorageError) as e:
        return _fail(str(e), 1)
    except ZvfsError as e:
        return _fail(str(e))
    except BrokenPipeError:  # (an OSError, but no failure: see main)
        raise
    except (OSError, ValueError) as e:  # what the backends raise for unusable URLs and hosts
        text = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0] if str(e) else type(e).__name__
        return _fail(f"{where}: {shown(text)}", 1)


def main(argv: list[str] | None = None, helper: bool = False) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if ARGV_ENV in os.environ:  # re-executed without credentials in argv: the real arguments
        real = json.loads(os.environ.pop(ARGV_ENV))
        argv, helper = real["argv"], real["helper"]
    if _is_bare_mount(argv):
        argv, helper = ["mount", *_strip_helper_flags(argv)], True
    _hide_credentials(argv, helper)
    try:
        try:
            status = _run(argv)
        finally:
            sys.stdout.flush()  # here, not at exit: a closed pipe is seen here (--help and --print-man included)
    except UsageError as e:
        _fail(str(e))
        return 1 if helper else 2
    except BrokenPipeError:
        # the reader went away (| head): no message, and nothing left for the exit's own flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED
    except KeyboardInterrupt:
        status = 130
    if helper and status:
        return 8 if status >= 128 else 32
    return status


def mount_helper_main() -> int:
    """`mount.zvfs SOURCE DIR [-sfnv] [-N NS] [-o OPTS] [-t TYPE]`, as mount(8) calls helpers;
    `-f` is mount(8)'s "fake": everything but the mount, which for zvfs is nothing."""
    argv = sys.argv[1:]
    if "-f" in argv:
        return 0
    return main(["mount", *_strip_helper_flags(argv)], helper=True)


if __name__ == "__main__":
    sys.exit(main())
