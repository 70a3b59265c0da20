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
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tspbench.core.errors import DamagedFileError, OutputError, UsageError

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
    # the temporary name stays short: a 250-byte name plus mkstemp's part would pass NAME_MAX
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
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


INPUT_LIMIT = 64 * 2**20  # bytes: the largest input file read whole (a profile, a record, a YAML)


def read_input(path: Path, limit: int = INPUT_LIMIT, error: type[UsageError] = DamagedFileError) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, else ``error`` naming it.

    Every input file is read here (#45): a FIFO given for a file would block the reader forever
    and a link to /dev/zero would be read until memory runs out, so the file is opened without
    blocking, refused unless it is a regular file, and read no further than ``limit`` bytes."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
        raise error(f"{path}: is {kind}; expected a file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise error(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{path}: larger than the {limit:,} bytes an input file may have")
    return data


def check_regular(path: Path, error: type[UsageError] = DamagedFileError) -> Path:
    """``path`` if it names a regular file (links followed), else ``error``: for readers that open
    the file themselves (np.load), so that a FIFO or a device is refused without opening it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path  # the reader's own "not found" says it best
    except OSError as exc:
        raise error(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
        raise error(f"{path}: is {kind}; expected a file")
    return path


def read_input_text(path: Path, limit: int = INPUT_LIMIT, error: type[UsageError] = DamagedFileError) -> str:
    """``read_input`` decoded as UTF-8, a byte that is not one being ``error`` naming the file."""
    data = read_input(path, limit, error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        byte = f"0x{data[exc.start]:02x}"
        raise error(f"{path}: not UTF-8 text: byte {byte} at line {line} (save it as UTF-8)") from None


NAME_MAX = 255  # bytes in one file or folder name (ext4, xfs, tmpfs)


def name_problem(path: Path) -> str | None:
    """Why ``path`` cannot be created as named (a part longer than NAME_MAX bytes), or None:
    checked before the work, so minutes of measuring never end in ENAMETOOLONG."""
    long = next((part for part in Path(path).parts if len(part.encode()) > NAME_MAX), None)
    if long is None:
        return None
    return f"a name of {len(long.encode())} bytes ({long[:24]}...): at most {NAME_MAX} bytes a name"


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
