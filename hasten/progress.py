"""Progress bars for long work: tqdm on a terminal, silent otherwise.

CI logs and redirected output should not fill with carriage-return spam, so the
bar is disabled unless stderr is a TTY (``HASTEN_PROGRESS=1`` forces it on,
``HASTEN_PROGRESS=0`` off).
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress_enabled() -> bool:
    forced = os.environ.get("HASTEN_PROGRESS")
    if forced is not None:
        return forced not in ("0", "", "false", "no")
    return sys.stderr.isatty()


def progress(iterable: Iterable[T] | None = None, **kwargs) -> tqdm:
    """``tqdm(iterable, **kwargs)``, disabled when output is not a terminal."""
    kwargs.setdefault("disable", not progress_enabled())
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", False)
    return tqdm(iterable, **kwargs)
