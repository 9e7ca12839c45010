"""Download a file once, verify its md5, and only then give it its final name.

The bytes go to ``.<name>.part-<pid>`` in the destination directory; the md5 is
computed while streaming; only a matching file is renamed into place (an atomic
``os.replace``), so a half-downloaded or corrupted file never looks complete and
is never reused. Offline, the first connection attempt fails within
``timeout`` seconds with a message saying how to use a local copy instead.
"""

from __future__ import annotations

import hashlib
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

from hasten.data.cache import file_digest
from hasten.errors import DataError

# Module attribute so tests can swap in a fake opener.
urlopen = urllib.request.urlopen

LOCAL_COPY_HINT = "pass a local copy with `--data PATH` or set HASTEN_DATA=PATH"


def download(url: str, dest: str | os.PathLike, md5: str, timeout: float = 10.0) -> Path:
    """Return ``dest``, downloading ``url`` there first unless a file with the
    right md5 is already in place. Raises ``DataError`` when offline, on HTTP
    errors and on an md5 mismatch (the bad bytes are deleted)."""
    dest = Path(dest)
    if dest.is_file() and file_digest(dest, "md5") == md5:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    h = hashlib.md5()
    try:
        try:
            with urlopen(url, timeout=timeout) as response, open(part, "wb") as out:
                while block := response.read(1 << 20):
                    h.update(block)
                    out.write(block)
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            raise DataError(f"could not download {url} ({reason}); no network? {LOCAL_COPY_HINT}") from None
        except OSError as e:
            raise DataError(f"could not download {url} to {str(dest)!r} ({e}); {LOCAL_COPY_HINT}") from None
        got = h.hexdigest()
        if got != md5:
            raise DataError(
                f"download of {url} has md5 {got}, expected {md5}: the file is corrupt or was "
                f"changed, and was deleted; try again, or {LOCAL_COPY_HINT}"
            )
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest
