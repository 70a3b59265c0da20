"""Writing outputs so that nothing is half-written and a failed write is one line.

Every file tspbench writes (records, tables, traces, profiles, figures) goes through
``write_atomic``: a temporary file in the same folder, fsynced, renamed over the old one, so a
reader or a crash sees the old content or the new, never a mix. A write that fails (ENOSPC on a
full disk, EROFS, EACCES) becomes an ``OutputError`` naming the path and the reason, which the
CLI prints as one line. An existing output that is not a regular file (``/dev/null``,
``/dev/full``, a FIFO) is written in place: renaming over it would replace the device node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tspbench.core.errors import OutputError, UsageError

_UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it) ...
os.umask(_UMASK)  # ... and put back at once
FILE_MODE = 0o666 & ~_UMASK  # what open() gives a new file; mkstemp's would be 0600


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``path`` atomically (see the module docstring); ``OutputError`` if it cannot be."""
    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    try:
        if path.exists() and not path.is_file() and not path.is_dir():
            _write_in_place(path, data)
        else:
            _replace(path, data)
    except OutputError:
        raise
    except OSError as exc:
        raise output_error(path, exc) from None
    return path


def output_error(path: Path, exc: OSError) -> OutputError:
    """'cannot write /x: No space left on device' as an OutputError (errno and path kept)."""
    reason = exc.strerror or str(exc)
    return OutputError(exc.errno or 0, f"cannot write {path}: {reason}", str(path))


def _write_in_place(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def check_suffix(path: Path, flag: str, allowed: tuple[str, ...]) -> Path:
    """``path`` if its name ends in one of ``allowed`` (``.json.gz`` counts whole), else an
    OutputError naming the flag and what is allowed: a format is chosen by the name, so a name
    that says none would be written in a format the reader of that name does not expect."""
    if not any(path.name.endswith(s) and len(path.name) > len(s) for s in allowed):
        raise UsageError(f"{flag} {path}: the name must end in {' or '.join(allowed)}")
    return path


@contextlib.contextmanager
def interrupt_deferred() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then handled as the handler before it would (Python's
    raises KeyboardInterrupt): files written together (a record and the summary that lists it)
    are all written or none. Off the main thread, a plain block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)
    elif caught and previous == signal.SIG_DFL:
        raise KeyboardInterrupt
