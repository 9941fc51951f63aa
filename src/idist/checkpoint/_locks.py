"""A save's lock file: ``.NAME.idist-lock-N``, held (``flock``) by rank 0 for the whole save.

A lock file that exists and that nobody holds marks a crashed save, whose leftovers the next
save's sweep removes. So the file is locked before it has its name: made unnamed
(``O_TMPFILE``) and linked in once locked, which leaves nothing behind when the process dies
in between; where the filesystem has no unnamed files, created as ``...-lock-N.new``, locked,
then renamed. A sweep removes a ``.new`` file nobody holds, and the save that was about to lock
it makes another.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import time
from pathlib import Path

from .._errors import CheckpointError

logger = logging.getLogger("idist.checkpoint")

_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400
#: the suffix of a lock file not yet locked (filesystems without unnamed files)
HIDDEN = ".new"
#: how often a save makes its hidden lock file again after sweeps removed it before giving up
_ROUNDS = 1024


def hidden(lock_path: Path) -> Path:
    """Where a save without unnamed files makes ``lock_path`` before it is locked."""
    return lock_path.with_name(lock_path.name + HIDDEN)


def locked(lock_path: Path) -> int:
    """The lock file at ``lock_path``, open and locked before it has that name: an unlocked lock
    file marks a crashed save, which another save's sweep removes (and then this save's folder).
    Made unnamed (``O_TMPFILE``) and linked in once locked, so a crash leaves no file at all;
    where the filesystem has no unnamed files, through ``...-lock-N.new``, which a sweep removes
    once nobody holds it (and this save then makes again)."""
    try:
        fd = os.open(lock_path.parent, os.O_TMPFILE | os.O_RDWR, 0o644)
    except (AttributeError, OSError):
        return _locked_through(lock_path)
    try:
        _lock(fd)  # nobody else can open an unnamed file
        _link_open_file(fd, lock_path)
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.EEXIST:
            raise
        return _locked_through(lock_path)  # no /proc here
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_open_file(fd: int, path: Path) -> None:
    """Give the unnamed file ``fd`` the name ``path`` (``linkat`` following ``/proc/self/fd``:
    Python's ``os.link`` calls ``link``, which would link the descriptor's magic link itself)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.linkat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    if libc.linkat(_AT_FDCWD, f"/proc/self/fd/{fd}".encode(), _AT_FDCWD, os.fsencode(path), _AT_SYMLINK_FOLLOW):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))


def _locked_through(lock_path: Path) -> int:
    through = hidden(lock_path)
    for _ in range(_ROUNDS):
        try:
            fd = os.open(through, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            time.sleep(0.01)  # a sweep holds it, and removes it
            continue
        try:
            if _lock(fd):
                os.rename(through, lock_path)
                return fd
        except FileNotFoundError:
            pass  # a sweep removed it before this save locked it
        except BaseException:
            os.close(fd)
            through.unlink(missing_ok=True)
            raise
        os.close(fd)
    raise CheckpointError(f"could not take the lock {lock_path}: other saves' clean-ups kept removing it")


def _lock(fd: int) -> bool:
    """Lock ``fd``; False when another process holds it (a sweep about to remove it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return False
        # a filesystem without locks: the file alone keeps other saves from removing this one
    return True


def remove_unheld(lock_path: Path) -> None:
    """Remove ``lock_path``'s hidden file if nobody holds it (its save makes another)."""
    through = hidden(lock_path)
    fd = take(through)
    if fd is not None and fd != -1:
        try:
            through.unlink(missing_ok=True)
        finally:
            os.close(fd)


def take(lock_path: Path) -> int | None:
    """The lock of a save that is gone (held open here), None if its file is gone too, -1 if not free."""
    try:
        fd = os.open(lock_path, os.O_RDWR)  # write access: NFS emulates flock with write locks
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("cannot open %s (%s): the save it belongs to is left in place", lock_path, exc)
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            logger.warning("cannot tell whether the save holding %s still runs (%s): left in place", lock_path, exc)
        return -1
    return fd
