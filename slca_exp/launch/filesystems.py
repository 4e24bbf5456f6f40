"""Which filesystem a path lives on, and whether that filesystem is reached over the network.

A cluster's shared folders (home, project, scratch) are usually NFS, Lustre, GPFS, BeeGFS or
CephFS mounts. SQLite's documentation warns that its file locking is unreliable on them, so the
launcher checks where the sqlite MLflow store would live before it submits jobs that run on other
nodes (``slca_exp.launch.profiles.network_store_problems``).

The type comes from the kernel's mount table (``/proc/self/mounts``): the longest mount point that
holds the path. Without a mount table (not Linux) nothing is known, and nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")
"""The kernel's mount table: ``device mount_point type options dump pass`` per line."""

NETWORK_FILESYSTEMS = frozenset(
    {
        "afs",
        "beegfs",
        "ceph",
        "cephfs",
        "cifs",
        "davfs",
        "gfs2",
        "glusterfs",
        "gpfs",
        "lustre",
        "ncpfs",
        "nfs",
        "nfs4",
        "ocfs2",
        "orangefs",
        "panfs",
        "pvfs2",
        "quobyte",
        "smb",
        "smb2",
        "smb3",
        "smbfs",
        "sshfs",
        "wekafs",
        "9p",
    }
)
"""Filesystem types (as the mount table names them) whose files other hosts write too.

A FUSE mount is named ``fuse.<type>`` (``fuse.sshfs``, ``fuse.glusterfs``); its ``<type>`` is
looked up here.
"""


def is_network(fs_type: str) -> bool:
    """Whether ``fs_type`` (a mount table type) is a network or cluster filesystem.

    Example:
        >>> is_network("nfs4"), is_network("fuse.sshfs"), is_network("ext4")
        (True, True, False)

    """
    return fs_type.lower().removeprefix("fuse.") in NETWORK_FILESYSTEMS


def filesystem_type(path: str | Path, mounts: Path = MOUNTS) -> str | None:
    """The type of the filesystem that holds ``path`` (or would hold it, if it does not exist yet).

    Args:
        path: any path; a missing one is looked up through its nearest existing parent.
        mounts: the mount table to read.

    Returns:
        The type (``ext4``, ``nfs4``, ``lustre``, ...), or ``None`` when the table cannot be read.

    """
    try:
        table = mounts.read_text()
    except OSError:
        return None
    # Symlinks are resolved in the part that exists; the rest is where it would be created.
    target, missing = Path(os.path.abspath(Path(path).expanduser())), []
    while not target.exists() and target != target.parent:
        target, missing = target.parent, [target.name, *missing]
    where = os.path.join(os.path.realpath(target), *missing)
    best, found = -1, None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the last of stacked mounts is the visible one
            best, found = len(point), fields[2]
    return found


def _unescape(field: str) -> str:
    r"""A mount point as the table writes it, with ``\040`` (space) and friends decoded."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
