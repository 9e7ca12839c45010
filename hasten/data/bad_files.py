"""Bad input policy, one for every reader of image files.

A file that cannot be decoded (``hasten.errors.BadImageError``) is skipped and listed
by name with its reason, until more than ``max_bad_fraction`` of the files were bad;
then ``check_bad_fraction`` stops the read with one ``DataError`` naming them.

Changes the training math: no.
"""

from __future__ import annotations

from hasten.errors import BadImageError, DataError


def bad_reason(error: BadImageError, name: str) -> str:
    """The reason in a ``BadImageError`` about ``name``, without the name."""
    return str(error).removeprefix(f"{name}: ")


def describe_skipped(skipped: list[tuple[str, str]], show: int = 10) -> str:
    """"name (reason); name (reason); and N more" for the first ``show`` bad files."""
    shown = "; ".join(f"{n} ({r})" for n, r in skipped[:show])
    return shown + (f"; and {len(skipped) - show} more" if len(skipped) > show else "")


def check_bad_fraction(skipped: list[tuple[str, str]], total: int, max_bad_fraction: float, source: str = "", *,
                       min_total: int = 0) -> None:
    """Raise a ``DataError`` naming the bad files once they are more than
    ``max_bad_fraction`` of ``total`` files. ``min_total``: count at least this
    many, so that a stream does not stop on one bad file among its first few."""
    if len(skipped) > max_bad_fraction * max(total, min_total):
        where = f"{source}: " if source else ""
        raise DataError(f"{where}{len(skipped)} of {total} files ({len(skipped) / max(total, 1):.1%}) are not "
                        f"readable images, more than max_bad_fraction={max_bad_fraction:g}: "
                        f"{describe_skipped(skipped)}")
