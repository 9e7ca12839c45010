"""The image-folder layout, ``train/<class>/*`` and ``test/<class>/*``, parsed from names.

One parser for every reader of image folders: the decode-once reader
(``hasten.data.image_folder``) and the streaming record store
(``hasten.stream.records``) label the same files the same way. It is
torchvision's ``ImageFolder`` layout: one folder per class, labels in the order of
the sorted class names. The layout may sit under a wrapping folder (archives
often have one); files deeper inside a class folder belong to that class;
dot-files (``.DS_Store``) are not samples.

Refused with one ``DataError`` each: no ``train/`` and ``test/`` side by side,
train and test with different classes, an empty class folder. A file directly in
``train/`` or ``test/`` is not an error but a *stray*, returned for the reader to
count with its bad files.
"""

from __future__ import annotations

from dataclasses import dataclass

from hasten.errors import DataError

SPLITS = ("train", "test")
_SHOW = 10  # names listed in one error message


@dataclass(frozen=True)
class SplitFiles:
    """The samples of one split: ``indices`` into the names given to ``parse_layout``,
    in (class, name) order, and each one's ``labels`` (an index into the classes)."""

    indices: list[int]
    labels: list[int]


@dataclass(frozen=True)
class Layout:
    """``root``: "" or the "<folder>/" prefix under which train/ and test/ sit.
    ``classes``: sorted class names. ``splits``: ``SplitFiles`` per split name.
    ``stray``: (name, reason) of files in a split folder but outside any class folder."""

    root: str
    classes: list[str]
    splits: dict[str, SplitFiles]
    stray: list[tuple[str, str]]


def parse_layout(names: list[str], dirs: list[str] = (), *, source: str = "") -> Layout:
    """The layout of files ``names`` (relative POSIX paths) and directories ``dirs``.

    ``dirs`` only matter for empty class folders: a folder listed there with no
    file under it is refused. ``source`` prefixes error messages.
    """
    where = f"{source}: " if source else ""
    root = _find_root(names + list(dirs), where)
    found: dict[str, dict[str, list[tuple[str, int]]]] = {s: {} for s in SPLITS}
    stray = []
    for name, index in [(d, None) for d in dirs] + [(n, i) for i, n in enumerate(names)]:
        parts = name[len(root):].split("/") if name.startswith(root) else []
        if len(parts) < 2 or parts[0] not in SPLITS or parts[-1].startswith("."):
            continue
        if len(parts) == 2 and index is not None:
            stray.append((name, f"not inside a {parts[0]}/<class>/ folder"))
            continue
        files = found[parts[0]].setdefault(parts[1], [])
        if index is not None:
            files.append((name, index))

    train, test = set(found["train"]), set(found["test"])
    if train != test:
        raise DataError(f"{where}train/ and test/ have different classes: only in train: "
                        f"{sorted(train - test) or 'none'}; only in test: {sorted(test - train) or 'none'}")
    empty = [f"{root}{s}/{c}" for s in SPLITS for c in sorted(found[s]) if not found[s][c]]
    if empty:
        raise DataError(f"{where}empty class folder(s): {', '.join(empty)}")
    classes = sorted(train)
    splits = {}
    for s in SPLITS:
        ordered = [(index, label) for label, c in enumerate(classes) for _, index in sorted(found[s][c])]
        splits[s] = SplitFiles([i for i, _ in ordered], [label for _, label in ordered])
    return Layout(root, classes, splits, stray)


def _find_root(names: list[str], where: str) -> str:
    """The shallowest prefix ("" or "<folder>/") with both train/ and test/ under it."""
    roots = set()
    for name in names:
        parts = name.split("/")
        for i, part in enumerate(parts[:-1]):
            if part in SPLITS:
                roots.add("/".join(parts[:i]))
                break
    for root in sorted(roots, key=lambda r: (r.count("/") if r else -1, r)):
        prefix = root + "/" if root else ""
        if all(any(n.startswith(f"{prefix}{s}/") for n in names) for s in SPLITS):
            return prefix
    top = sorted({n.split("/")[0] for n in names})
    hint = ""
    if any(n.rsplit("/", 1)[-1] == "data_batch_1" for n in names):
        hint = ("; this looks like the pickled 'python version' of CIFAR-10, which is never unpickled "
                "here (it can run code): use the binary version, cifar-10-binary.tar.gz")
    raise DataError(
        f"{where}expected folders train/<class>/ and test/<class>/, found "
        f"{', '.join(top[:_SHOW]) or 'nothing'}{' ...' if len(top) > _SHOW else ''}{hint}"
    )
