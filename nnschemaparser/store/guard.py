"""What keeps a store folder from being turned against its user: no symbolic links inside it, files
created without following links, and one writer at a time.

A store is a folder of plain files in four plain sub-folders (manifest.py gives the layout). A store
received from someone else (a tarball keeps symlinks; a shared folder may be written by others) may
hold links: `tensors/` pointing outside the store, or `.manifest.json.<pid>.tmp` pointing at the
user's `~/.bashrc`. Reading through the first reads files the commits never vouched for; writing
through the second truncates any file the user can write. So:

- `check_no_links(root)` refuses a store whose manifest, sub-folders or any entry of them is a
  symbolic link (`StoreLinkError`, a `MalformedFileError`, naming the link, where it points and the
  fix); the writer checks every entry before it writes, the reader the manifest and sub-folders
  (each file a commit names is checked by the commit reader);
- `create(path)` creates a file with `O_CREAT | O_EXCL | O_NOFOLLOW`: a link planted after the check
  is refused, never followed, and a file already there (a leftover, or a hard link to a file
  elsewhere) is unlinked first rather than truncated in place;
- `StoreLock` takes an exclusive `flock` on `<store>/.lock` for the whole of a write, without
  waiting: a second writer gets `StoreBusyError` naming the holder (pid, host and start time, written
  into the lock file). The kernel drops a `flock` when its process ends, however it ends (killed,
  crashed, out of memory), so a dead writer never leaves the store locked: the lock file it leaves
  says who held it last and is taken over by the next writer.

Depends on files (the error types) only.
"""

from __future__ import annotations

import datetime
import errno
import os
import socket
from pathlib import Path
from typing import Optional

from ..files.file_format import MalformedFileError

__all__ = ["StoreLinkError", "StoreBusyError", "check_no_links", "check_not_link", "create", "StoreLock",
           "LOCK_FILE", "FOLDERS"]

FOLDERS = ("commits", "steps", "tensors", "reductions")
LOCK_FILE = ".lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StoreLinkError(MalformedFileError):
    """A store folder holds a symbolic link: it is neither read nor written through."""


class StoreBusyError(RuntimeError):
    """Another capture_dataset is writing the store (it holds the store's lock)."""


def _link_error(path: Path, root: Path) -> StoreLinkError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return StoreLinkError(f"{path} is a symbolic link (to {target}): a store holds plain files and folders only, and "
                          f"nothing in {root} is read or written through a link. Check where it points, then remove "
                          "the link (or put the real folder or file in its place)")


def check_not_link(path: Path, root: Path) -> None:
    """Refuse `path` (inside the store at `root`) if it is a symbolic link."""
    if path.is_symlink():
        raise _link_error(path, root)


def check_no_links(root: Path, every_entry: bool) -> None:
    """Refuse the store at `root` if its manifest or a sub-folder is a symbolic link; with `every_entry`, if any
    entry of the store folder or of its sub-folders is one (what a writer checks before it writes). The store's
    own path may pass through links (a data disk mounted through one): only what is inside it is checked."""
    if every_entry:
        entries = list(root.iterdir()) if root.is_dir() else []
        for folder in FOLDERS:
            path = root / folder
            if path.is_dir() and not path.is_symlink():
                entries.extend(path.iterdir())
    else:
        entries = [root / "manifest.json"] + [root / folder for folder in FOLDERS]
    for path in entries:
        check_not_link(path, root)


def create(path: Path, direct: bool = False) -> int:
    """A new file at `path` open for writing (its fd): never through a link, never a file truncated in place."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | (os.O_DIRECT if direct else 0)
    try:
        return os.open(path, flags, 0o666)
    except FileExistsError:
        pass
    if path.is_symlink():
        raise _link_error(path, path.parent.parent if path.parent.name in FOLDERS else path.parent)
    path.unlink()  # a leftover of ours, or a hard link: replaced, its other names untouched
    return os.open(path, flags, 0o666)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 1024, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if not fields.get("pid"):
        return "another process (it wrote no name into the lock file yet)"
    return f"pid {fields['pid'][:20]} on host {fields.get('host', '?')[:255]}, since {fields.get('since', '?')[:40]}"


class StoreLock:
    """The exclusive write lock of the store at `root` (module docstring); a context manager."""

    def __init__(self, root: Path):
        self.root = root
        self.path = root / LOCK_FILE
        self.fd: Optional[int] = None

    def __enter__(self) -> "StoreLock":
        import fcntl

        for _ in range(8):  # the file may be replaced between its open and the lock: open it again
            check_not_link(self.path, self.root)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise StoreBusyError(
                    f"{self.root} is being written by another capture_dataset ({holder}): two writers would "
                    "remove each other's files. Wait for it to finish, then run this call again (it writes only "
                    "the inputs still missing), or write into another store. The lock is the kernel's and ends "
                    "with that process, however it ends.") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            text = f"pid={os.getpid()} host={socket.gethostname()} since={since}\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
            self.fd = fd
            return self
        raise StoreBusyError(f"{self.root}: its lock file {self.path} keeps being replaced; is another program "
                             "removing it? Run again once nothing else touches the store")

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock; the file stays (removing it would race a writer opening it)
            self.fd = None
