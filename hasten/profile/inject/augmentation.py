"""Whether the training dataset's items are drawn at random (augmentation), and one item's size before it.

A device-resident loader decodes the dataset once: where ``__getitem__`` crops and flips at
random, that freezes every crop and flip, and the fix changes the training math (issue 43).
Read here, once the measured window and the probes are done, from the training loader's
dataset in the profiled process:

- ``random_transforms``: one index read twice; True when the two items differ, False when
  they are the same, None when not checked (an ``IterableDataset``, no training loader, a
  read that raised);
- ``decoded_sample_bytes``: the bytes of that item before its transforms, where they can be
  known: a dataset whose ``transform`` (torchvision's convention, through ``Subset``-style
  ``.dataset`` wrappers) is set to None for one read and put back, or a ``TensorDataset``;
  else None.

Python's, numpy's and torch's random states are put back as they were, and so is the
transform. Three ``__getitem__`` calls, outside any timed step, given :data:`READ_TIMEOUT_S`.

Changes the training math: no.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from hasten.profile.inject.state import State


# The reads run in a thread given this long: a dataset whose read blocks (a remote store gone) leaves
# the fields unchecked, never the process hanging on its way out.
READ_TIMEOUT_S = 10.0


def facts(st: State) -> dict:
    """``{"random_transforms", "decoded_sample_bytes"}`` of the training loader's dataset."""
    import threading
    unchecked = {"random_transforms": None, "decoded_sample_bytes": None}
    dataset = _training_dataset(st)
    if dataset is None:
        return unchecked
    found = {}
    reader = threading.Thread(target=lambda: found.update(_read(st, dataset)), daemon=True,
                              name="hasten-profile-augmentation")
    reader.start()
    reader.join(READ_TIMEOUT_S)
    return dict(found) if not reader.is_alive() and found else unchecked


def _read(st: State, dataset) -> dict:
    out = {"random_transforms": None, "decoded_sample_bytes": None}
    saved = _rng_states()
    was = st.in_probe
    st.in_probe = True  # hasten's own reads: no hook counts them
    try:
        first = dataset[0]
        out["random_transforms"] = not _same(first, dataset[0])
        out["decoded_sample_bytes"] = _untransformed_bytes(dataset, first)
    except Exception:  # a dataset that cannot be read here (a closed file, a worker-only handle): unchecked
        pass
    finally:
        st.in_probe = was
        _restore_rng(saved)
    return out


def _training_dataset(st: State):
    from torch.utils.data import IterableDataset
    if st.train_iter is None:
        return None
    dataset = getattr(getattr(st.train_iter[0], "_hasten_owner", None), "dataset", None)
    if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    try:
        return dataset if len(dataset) > 0 else None
    except TypeError:
        return None


def _untransformed_bytes(dataset, item) -> int | None:
    from torch.utils.data import TensorDataset
    holder = dataset
    while not hasattr(holder, "transform") and hasattr(holder, "dataset"):  # Subset and its kind
        holder = holder.dataset
    if isinstance(holder, TensorDataset):
        return _nbytes(item) or None
    if not hasattr(holder, "transform"):
        return None
    transform = holder.transform
    if transform is None:
        return _nbytes(item) or None
    try:
        holder.transform = None
        raw = dataset[0]
    finally:
        holder.transform = transform
    return _nbytes(raw) or None


def _nbytes(x) -> int:
    """Bytes of the arrays in an item: tensors, numpy arrays, PIL images, bytes; labels and the like count 0."""
    import torch
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (bytes, bytearray, memoryview)):
        return len(x)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return x.nbytes
    if hasattr(x, "getbands") and hasattr(x, "tobytes"):  # a PIL image
        return len(x.tobytes())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    if isinstance(x, Mapping):
        return sum(_nbytes(v) for v in x.values())
    return 0


def _same(a, b) -> bool:
    """Whether two reads of one item are equal: tensors, arrays and images by content, containers
    leaf by leaf, anything else by ``==``."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if hasattr(a, "getbands") and hasattr(a, "tobytes"):
        return (hasattr(b, "tobytes") and a.size == b.size and a.mode == b.mode and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # an object without a plain ==: not known to be the same
        return False


def _rng_states():
    import random

    import torch
    np = sys.modules.get("numpy")
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return (random.getstate(), np.random.get_state() if np is not None else None, torch.get_rng_state(), cuda)


def _restore_rng(saved) -> None:
    import random

    import torch
    py, np_state, cpu, cuda = saved
    random.setstate(py)
    if np_state is not None:
        sys.modules["numpy"].random.set_state(np_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
