"""Who can reach a file of a local store: its read bits folded over the directories above it.

A mount shows every node with one owner, group and mode, and with `allow_other` the kernel
(`default_permissions`) grants access from those alone. A reader of the store itself must also
search every directory on the way to a file (the store root's ancestors, the root, a group, an
array, its `c/`, a shard's row directories), and many of those have no node in a view (N5 and
Zarr v2 never show `c/`; no view shows a shard's directories). So the bits a node shows are its
own, less every class of reader that some directory on its path stops (`reach`): a directory
closed to others (0700) closes everything below it to others, in every view.

"On its path" is every directory in which the kernel looks a name up on the way, symlinks
followed as it follows them (storage/walk.py): for `linkarr -> private/arr` that is the root,
`private` and `arr`, not only the root. Which directories those are is found once per store
directory (and per file reached through a link of its own), not per open.

The fold is exact when the path's directories have the file's owner and group (the common
case), and otherwise never wider than the store: a reader of a class is let through only if
every user that class can hold passes each directory (a group member may own a directory, a
reader who is neither owner nor group member may still be in a directory's group).

POSIX ACLs (`system.posix_acl_access`, on files and directories alike) are read and folded
into the three classes before anything else (`narrowed`): mode bits cannot say "everyone but
user X", so an entry that grants some named user or group less than its class's bits narrows
the whole class (a `user:X:---` entry on a 0755 directory shows it as 0700: everyone but its
owner is stopped in the mount, where the store stops X alone). Narrower than the store, never
wider. An entry that grants more than the mode bits (`user:X:r` on a 0600 file) is not shown:
X reads such a file in the store, not through the mount. An ACL that cannot be read or parsed
leaves the owner's bits alone (the kernel does the same: it checks the owner before the ACL).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import struct
from functools import lru_cache

#: one directory on a path: (owner, group, permission bits, ACL already folded in: `narrowed`)
Dir = tuple[int, int, int]
USER, GROUP, OTHER = 0o700, 0o070, 0o007
#: a directory that cannot be looked at (gone, not a directory, a lookup that fails): no one passes
CLOSED: Dir = (0, 0, 0)
NO_GROUP = -1  # a group id no process holds (`link_gate`)

ACL_ACCESS = "system.posix_acl_access"
#: e_tag values of the kernel's on-disk ACL (include/uapi/linux/posix_acl.h) and the xattr
#: version (include/uapi/linux/posix_acl_xattr.h): a u32 version, then (u16 tag, u16 perm, u32 id)
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
ACL_XATTR_VERSION = 2
_HEADER, _ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
#: what `acl_of` gives for an ACL it could not read: only the owner keeps its bits
UNREADABLE = b"?"
_NO_ACL = (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP)


@lru_cache(maxsize=1024)
def groups_of(uid: int) -> frozenset[int] | None:
    """Every group `uid` is in (primary and supplementary), None for a user unknown here."""
    try:
        pw = pwd.getpwuid(uid)
        return frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, OSError):
        return None


def reach(path: list[Dir] | tuple[Dir, ...], uid: int, gid: int) -> int:
    """The permission classes of a file owned by `uid`:`gid` whose readers get through every
    directory of `path` (0o777 less the classes stopped somewhere), to be ANDed with the file's
    own bits. Root (uid 0) passes every directory."""
    u = g = o = True
    member_of = groups_of(uid) if uid else None
    for d_uid, d_gid, d_mode in path:
        ux, gx, ox = bool(d_mode & 0o100), bool(d_mode & 0o010), bool(d_mode & 0o001)
        if uid:  # the file's owner: exactly one class of the directory applies
            if d_uid == uid:
                u &= ux
            elif member_of is None:  # groups unknown: either of the other two
                u &= gx and ox
            else:
                u &= gx if d_gid in member_of else ox
        owner_ok = d_uid == uid or ux  # any other reader may own the directory
        g &= owner_ok and gx and (d_gid == gid or ox)  # members of the file's group
        o &= owner_ok and ox and (d_gid == gid or gx)  # everyone else (never in the file's group)
    return (USER if u else 0) | (GROUP if g else 0) | (OTHER if o else 0)



def fold(dirs: list[Dir] | tuple[Dir, ...], uid: int, gid: int) -> int:
    """Read and search bits for a directory owned by `uid`:`gid` that stands for all of `dirs`
    at once (a view's directory whose entries come from several store directories): a class
    gets read (search) only where every user it can hold reads (searches) every one of them,
    by `reach` over their read (search) bits. Exact where they all have that owner and group."""
    r = reach([(u, g, (m & 0o444) >> 2) for u, g, m in dirs], uid, gid)
    x = reach([(u, g, m & 0o111) for u, g, m in dirs], uid, gid)
    return (r & 0o444) | (x & 0o111)

# -- POSIX ACLs ------------------------------------------------------------------------------


def acl_of(target: str | int, follow_symlinks: bool = False) -> bytes | None:
    """The access ACL of a path (its last component not followed) or of an open descriptor
    (not an O_PATH one), None when it has none (or its filesystem keeps none); `UNREADABLE`
    when it cannot be read."""
    try:
        return os.getxattr(target, ACL_ACCESS, follow_symlinks=follow_symlinks or isinstance(target, int))
    except OSError as e:
        return None if e.errno in _NO_ACL else UNREADABLE


def acl_support(fd: int) -> tuple[bytes | None, bool]:
    """(`acl_of` the open descriptor, whether its filesystem keeps ACLs at all: a listing
    asks nothing more of the files beside it on that filesystem when it does not)."""
    try:
        return os.getxattr(fd, ACL_ACCESS), True
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            return None, False
        return (None, True) if e.errno == errno.ENODATA else (UNREADABLE, True)


def needs_acl(mode: int) -> bool:
    """Whether an ACL can change who reads a node of permission bits `mode`: the kernel
    consults an ACL only for a caller who is not the owner, and only when the group class
    (the ACL's mask) has some bit (fs/namei.c, acl_permission_check)."""
    return bool(mode & GROUP)


def narrowed(mode: int, acl: bytes | None, owner: int) -> int:
    """Permission bits `mode` (S_IMODE) of a node owned by `owner` with access ACL `acl`, as
    three classes no wider than what the ACL grants to any user who may fall in each
    (fs/posix_acl.c, posix_acl_permission):

    - owner: the mode's own bits (the kernel checks the owner before any ACL);
    - group class (members of the node's group): GROUP_OBJ & MASK, less what a named-user
      entry (for anyone but the owner) grants under the mask (that user may be a member);
    - other class: OTHER, less what a named-user entry grants, less what a named-group entry
      grants (a member of a named group that the entry does not grant is refused, even where
      OTHER would let them in).

    Named entries that grant more than their class are not shown (never wider)."""
    mode &= 0o777
    if acl is None or not needs_acl(mode):
        return mode
    entries = parse_acl(acl)
    if entries is None:  # the kernel refuses every caller but the owner (EIO, EINVAL)
        return mode & USER
    group_obj, other, mask = 7, 7, 7
    named = 7  # the least any named entry grants (before the mask); 7 with no named entries
    named_users = 7  # the same, of named users alone
    has_named = False
    for tag, perm, ident in entries:
        if tag == ACL_GROUP_OBJ:
            group_obj = perm
        elif tag == ACL_OTHER:
            other = perm
        elif tag == ACL_MASK:
            mask = perm
        elif tag == ACL_USER and ident != owner:  # (the owner is matched as the owner first)
            named_users &= perm
            named &= perm
            has_named = True
        elif tag == ACL_GROUP:
            named &= perm
            has_named = True
    # The mask limits GROUP_OBJ and every named entry, never OTHER: where a named entry exists
    # (a parsed ACL with one always has a mask), those it names get at most `named & mask`.
    g = group_obj & mask & named_users
    o = other & (named & mask if has_named else 7)
    return mode & (USER | g << 3 | o)


def parse_acl(blob: bytes) -> list[tuple[int, int, int]] | None:
    """(tag, perm, id) entries of an ACL xattr, None when it is not one the kernel would take
    (wrong version or length, an unknown tag, a missing USER_OBJ/GROUP_OBJ/OTHER, named entries
    without a mask)."""
    if len(blob) < _HEADER.size or (len(blob) - _HEADER.size) % _ENTRY.size:
        return None
    if _HEADER.unpack_from(blob)[0] != ACL_XATTR_VERSION:
        return None
    entries = [(tag, perm & 7, ident) for tag, perm, ident in _ENTRY.iter_unpack(blob[_HEADER.size:])]
    tags = [t for t, _, _ in entries]
    if any(t not in (ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER) for t in tags):
        return None
    if tags.count(ACL_USER_OBJ) != 1 or tags.count(ACL_GROUP_OBJ) != 1 or tags.count(ACL_OTHER) != 1 \
            or tags.count(ACL_MASK) > 1 or (ACL_MASK not in tags and (ACL_USER in tags or ACL_GROUP in tags)):
        return None
    return entries


def dir_of(st: os.stat_result, acl: bytes | None = None) -> Dir:
    """A directory on a path as `reach` folds it: owner, group, and its bits narrowed by its ACL."""
    return st.st_uid, st.st_gid, narrowed(stat.S_IMODE(st.st_mode), acl, st.st_uid)


def dir_facts(path: str, st: os.stat_result | None = None) -> Dir:
    """`dir_of` a real directory path (no symlink in it; `st`: its lstat if already taken),
    CLOSED when it is not a directory now (blocking: worker threads, or the store's opening)."""
    try:
        st = st or os.lstat(path)
    except OSError:
        return CLOSED
    if not stat.S_ISDIR(st.st_mode):
        return CLOSED
    return dir_of(st, acl_of(path) if needs_acl(stat.S_IMODE(st.st_mode)) else None)


Subdirs = tuple[frozenset[Dir], tuple[str, ...]]


def subdir_facts(path: str, names: range, stalling: frozenset[str] = frozenset()) -> Subdirs | None:
    """The distinct `dir_facts` of the subdirectories of real directory `path` (no symlink in
    it) named by a number in `names` (a chunk grid's row directories: `views/chunkbits.py`
    folds a span of thousands of them from one scan of their parent, not a walk of each),
    CLOSED for a mount point that may stall (`stalling`: not looked at) or one that cannot be
    looked at; files are no directories (nothing below them); and the names of those that are
    symlinks (their bits are those of their targets' walks: `LocalStore.learn_subdirs` walks
    them). None when `path` is not a directory now (blocking: worker threads)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    found: set[Dir] = set()
    links: list[str] = []
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != path:  # (a directory on the way replaced by a link)
            return frozenset((CLOSED,)), ()
        with os.scandir(fd) as it:
            for de in it:
                name = de.name
                if not (name.isascii() and name.isdigit()) or str(int(name)) != name or int(name) not in names:
                    continue
                full = f"{path}/{name}" if path != "/" else f"/{name}"
                if full in stalling:
                    found.add(CLOSED)
                    continue
                try:
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if stat.S_ISLNK(st.st_mode):
                    links.append(name)
                elif stat.S_ISDIR(st.st_mode):
                    found.add(dir_of(st, acl_of(full) if needs_acl(stat.S_IMODE(st.st_mode)) else None))
    except OSError:
        return frozenset((CLOSED,)), ()
    finally:
        os.close(fd)
    return frozenset(found), tuple(sorted(links))


def link_gate(link: os.stat_result, parent: os.stat_result) -> Dir | None:
    """With `fs.protected_symlinks` (the default on Debian and most distributions), a symlink
    in a sticky world-writable directory is followed only by its owner, or by anyone when the
    directory's owner owns the link too (fs/namei.c, may_follow_link): a gate that only the
    link's owner passes, as a directory `reach` folds (None when everyone may follow it)."""
    sticky_world = stat.S_ISVTX | stat.S_IWOTH
    if parent.st_mode & sticky_world != sticky_world or parent.st_uid == link.st_uid:
        return None
    return link.st_uid, NO_GROUP, 0o100


def protected_symlinks() -> bool:
    try:
        with open("/proc/sys/fs/protected_symlinks") as f:
            return f.read().strip() not in ("", "0")
    except OSError:
        return True  # not known: assume the stricter rule (narrower, never wider)
