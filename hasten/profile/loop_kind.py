"""What a training loop's batches hold (images, tokens or other tensors), and the words and code its
advice uses for them.

Issue 32 (item 5) asks for advice that fits the loop: a character model's loader was told to
build ``HostLoader(images, labels, batch_size)``, an image loader that crops, flips and
normalises what it is given, which for token ids is wrong code, not only a wrong word. The kind
is read from the shapes and dtypes of the first training batch's tensors
(:func:`hasten.profile.inject.batches.tensor_layout`):

- **images**: a floating-point or ``uint8`` tensor of four dimensions with a channel dimension of
  1, 3 or 4 next to the rows or last, and both spatial dimensions at least 8 (``N, C, H, W`` or
  ``N, H, W, C``);
- **tokens**: a first tensor of integers in two dimensions (``N, T``: rows of token ids);
- **tensors**: anything else (features, a time series, a batch that could not be seen).

Where it is unsure, it says tensors: the plainest words fit every loop.

Changes the training math: no (words only). Of the code it prints, the image loader normalises
by the images' channel statistics and crops and flips as its ``Augmentation`` says, none by
default (``hasten.data.host_loader``); the in-memory
index of tokens or tensors hands out the same rows a shuffled DataLoader would, in an order of
its own.
"""

from __future__ import annotations

from dataclasses import dataclass

_INTEGER = ("int64", "int32", "int16", "int8", "uint16", "uint32", "uint64")
_IMAGE_DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8")
CHANNELS = (1, 3, 4)
MIN_SIDE = 8


def _is_image(t: dict) -> bool:
    shape = t.get("shape") or []
    if len(shape) != 4 or t.get("dtype") not in _IMAGE_DTYPES:
        return False
    _, a, b, c = shape
    return (a in CHANNELS and min(b, c) >= MIN_SIDE) or (c in CHANNELS and min(a, b) >= MIN_SIDE)


def loop_kind(layout: list[dict] | None) -> str:
    """``"images"``, ``"tokens"`` or ``"tensors"``, from a batch's tensors (shape, dtype: see the module)."""
    if not layout:
        return "tensors"
    if any(_is_image(t) for t in layout):
        return "images"
    first = layout[0]
    if first.get("dtype") in _INTEGER and len(first.get("shape") or []) == 2:
        return "tokens"
    return "tensors"


@dataclass(frozen=True)
class Words:
    """The names a loop's advice gives its batch's parts, and how its data is made once."""
    kind: str
    inputs: str  # the model's input, as a variable name
    targets: str  # the second tensor of a pair
    prepare: str  # what making the data once means, in the fix's name
    once: str  # the one-off line that makes it (valid Python)


WORDS = {
    "images": Words("images", "images", "labels", "decode the images into a uint8 memmap",
                    "np.memmap('train.u8', dtype=np.uint8, mode='w+', shape=images.shape)[:] = images"),
    "tokens": Words("tokens", "tokens", "targets", "tokenize into a memmap",
                    "np.memmap('train.bin', dtype=np.uint16, mode='w+', shape=(len(tokens),))[:] = tokens"),
    "tensors": Words("tensors", "inputs", "targets", "make it into arrays saved to disk",
                     "np.save('inputs.npy', inputs); np.save('targets.npy', targets)"),
}


def words_for(layout: list[dict] | None) -> Words:
    return WORDS[loop_kind(layout)]


def _names(w: Words, layout: list[dict]) -> list[str]:
    keys = [t.get("key") for t in layout]
    if keys and all(isinstance(k, str) and k.isidentifier() for k in keys):
        return [f"{k}s" if not k.endswith("s") else k for k in keys]  # 'image', 'mask' -> images, masks
    n = len(layout) or 2
    targets = w.targets if w.kind != "images" or _labels_only(layout) else "targets"
    if n == 1:
        return [w.inputs]
    if n == 2:
        return [w.inputs, targets]
    return [f"{w.inputs}{i}" if i else w.inputs for i in range(n)]


def _labels_only(layout: list[dict]) -> bool:
    """Whether every tensor besides the images is one value per example (class labels), as hasten's
    image loader takes them: a segmentation mask is cropped and flipped with its image, which it does not."""
    return all(len(t.get("shape") or []) <= 1 for t in layout if not _is_image(t))


def image_loader_code(device: str, augment: str = "") -> str:
    """hasten's image loader over the decoded images, as the report prints it: what it takes (layout and
    dtype), where such tensors come from, and what it does to them besides batching (its own
    normalisation; augmentation only as ``augment`` says, none by default: hasten.data.host_loader)."""
    loader = "device_loader.GpuLoader" if device == "cuda" else "host_loader.HostLoader"
    extra = f", augment={augment}" if augment else ""
    does = (f"it normalises by the images' own channel mean and std (mean=, std= to give yours)"
            + (", crops and flips each batch as augment= says" if augment else
               ", and does not augment (augment=Augmentation(...) to crop and flip)"))
    return (f"loader = hasten.data.{loader}(images, labels, batch_size{extra})\n"
            "     # images: uint8 (N, C, H, W), labels: int64 (N,), decoded once into memory, e.g.\n"
            "     # hasten.data.sources.load_dataset(folder, image_size=S).train.images and .labels;\n"
            f"     # {does}")


def resident_code(layout: list[dict] | None, device: str) -> str:
    """The device-resident loader, as the report prints it (lines after the first indented by five
    spaces, as the report indents them): hasten's image loader over the decoded images with their
    labels, or for anything else (tokens, tensors, images with masks, a mapping of tensors) every item
    of the dataset stacked once and indexed per batch."""
    layout = layout or []
    w = words_for(layout)
    keys = [t.get("key") for t in layout]
    if w.kind == "images" and len(layout) <= 2 and _labels_only(layout) and not any(keys):
        return image_loader_code(device)
    names = _names(w, layout)
    to = ".to('cuda')" if device == "cuda" else ""
    items = "(dataset[i] for i in range(len(dataset)))"
    if all(isinstance(k, str) for k in keys) and keys and len(names) == len(keys):
        once = (f"{', '.join(names)}{',' if len(names) == 1 else ''} = (torch.stack([dataset[i][k] for i in "
                f"range(len(dataset))]){to} for k in {tuple(keys)!r})")
        pick = "batch = {" + ", ".join(f"{k!r}: {n}[idx]" for k, n in zip(keys, names)) + "}"
    elif len(names) == 1:
        once = f"{names[0]} = torch.stack(list({items})){to}"
        pick = f"x = {names[0]}[idx]"
    else:
        once = f"{', '.join(names)} = (torch.stack(t){to} for t in zip(*{items}))"
        rows = ", ".join(f"{n}[idx]" for n in names)
        pick = f"x, y = {rows}" if len(names) == 2 else f"batch = ({rows})"
    return (f"{once}   # once, into memory\n"
            f"     for idx in torch.randperm(len({names[0]})).split(batch_size): {pick}   # an epoch of batches")
