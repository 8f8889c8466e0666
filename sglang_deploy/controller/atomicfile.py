"""The one way this package writes a file on the controller atomically: a reader (or a crash)
sees the whole new file or the whole old one, never a part.

The text goes to a temporary file in the same folder (the same file system: the rename is
atomic), is flushed and fsynced, then ``os.replace`` puts it over the target; on any error
the temporary file is removed and the old file stays. ``replacing`` yields the open
temporary file (a stream written in pieces: ``cache save``); ``write`` writes a whole text.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: str = "w", parents: bool = True
              ) -> Iterator[IO]:
    """Open a temporary file beside PATH for writing (MODE ``w`` or ``wb``); when the block
    ends without an error it replaces PATH (fsynced first), else it is removed. PARENTS:
    make PATH's missing folders first (else a missing folder is an error)."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write DATA (text or bytes) to PATH atomically; returns PATH."""
    with replacing(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
    return Path(path)


def _umask() -> int:
    """The process's umask (``mkstemp`` makes a 0600 file: the result gets the mode a plain
    ``open`` would have given it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
