"""Files and directories a run's host-side tools write where others can write too (an NFS export), made by cloudbox.

A name in a shared directory can be replaced between the moment cloudbox makes it and the moment a tool (root's fio,
dd, IOzone, mke2fs, mpirun) opens it: a symbolic link to a disk or to root's keys, or a device node, would then be
written through. So the file is created here with O_CREAT|O_EXCL|O_NOFOLLOW, checked to be a regular file, kept
open for the run, and handed to the tools as its descriptor's /proc link (`tool_path`): the kernel resolves that
link to the open file itself, whatever the name points to by then. The name is checked again after every tool
(`check`); a name that is not cloudbox's file any more ends the run with `ForeignFile`, naming what it found.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from typing import ClassVar

from ..errors import CloudboxError


class ForeignFile(CloudboxError):
    """A name cloudbox makes for a run's tools holds something cloudbox did not make there."""


def _kind(st: os.stat_result, path: str) -> str:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    return ("a block device" if stat.S_ISBLK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a directory" if stat.S_ISDIR(mode) else "a regular file")


def _refuse(path: str, where: str, when: str) -> ForeignFile:
    try:
        found = _kind(os.lstat(path), path)
    except FileNotFoundError:
        found = "nothing (it was removed)"
    except OSError as e:
        found = f"something this host cannot read ({e.strerror})"
    return ForeignFile(f"{path} {when} {found}, not the file cloudbox made for the bare-metal tests {where}: the run "
                       "stops without writing there (another client of the export wrote into it)")


@dataclass
class _Claimed:
    """What a claimed file and a claimed directory share: the name, the descriptor kept open, and their checks."""

    path: str
    fd: int
    where: str  # the place named in a refusal, e.g. "on the NFS export"

    KIND: ClassVar[int]  # the file type made (stat.S_IFREG, S_IFDIR)

    @property
    def tool_path(self) -> str:
        """The path a tool opens: this process's descriptor, so the kernel reaches this file and nothing else."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def ours(self) -> bool:
        """The name still names what was made (of its type, with its device and inode)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return stat.S_IFMT(st.st_mode) == self.KIND and (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def check(self) -> None:
        """ForeignFile when the name was replaced since it was made."""
        if not self.ours():
            raise _refuse(self.path, self.where, "now holds")


@dataclass
class ClaimedFile(_Claimed):
    """A regular file made by this process for the tools and kept open; `tool_path` is what they are given."""

    KIND = stat.S_IFREG

    @classmethod
    def create(cls, path: str, *, where: str = "") -> ClaimedFile:
        """Make `path` (it must not exist: a name already there is refused, whatever it is)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise _refuse(path, where, "already holds") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # O_EXCL made it: only a file system that lies gets here
            os.close(fd)
            raise ForeignFile(f"{path}: made as a file but is {_kind(st, path)}")
        return cls(path, fd, where)

    def ready(self, size: int) -> None:
        """Checked, and at least `size` bytes allocated: fio re-lays-out (unlinks and makes anew) a file shorter
        than its job, which it cannot do through the descriptor's link; dd and IOzone truncate it."""
        self.check()
        if os.fstat(self.fd).st_size < size:
            os.posix_fallocate(self.fd, 0, size)

    def release(self) -> None:
        """The name removed when it is still this file (what replaced it is left where it is), the file closed."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            if self.ours():
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


@dataclass
class ClaimedDir(_Claimed):
    """A directory made by this process (mode 0700) for tools that make their own files in it (MPI-IO's file per
    rank), kept open; `tool_path` reaches it through the descriptor."""

    KIND = stat.S_IFDIR

    @classmethod
    def create(cls, path: str, *, where: str = "") -> ClaimedDir:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            raise _refuse(path, where, "already holds") from None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise _refuse(path, where, "now holds") from None
        return cls(path, fd, where)

    def release(self) -> None:
        """Its files and the directory removed (through the descriptor: nothing outside it is followed)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            for name in os.listdir(self.fd):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self.fd)
            self.check()
            os.rmdir(self.path)
        os.close(self.fd)
        self.fd = -1
