"""The device-resident loader fix: the dataset held in memory, each batch gathered from it.

From David Page's "How to train your ResNet" and Keller Jordan's airbench (the dataset decoded
once and kept on the device; :mod:`hasten.data.device_loader`). Predicted at the step with its
data made free (the batch is already there), when the dataset fits in a quarter of the device's
memory, counted in decoded items (``decoded_sample_bytes``: one item before its transforms) where
the run measured them, else in batches as the loop received them.

A dataset whose items are transformed at random (two reads of one index differ:
``random_transforms``) loses its augmentation in a loader that stacks its items once: every
epoch then trains on the same crops and flips (or whatever else an item draws at random: a
pair). That fix is labelled as changing the math, and a second is offered beside it: the decoded
images resident, augmented per batch, as hasten's own loaders do (issue 43).

Changes the training math: no (analysis only); each fix says whether it does.
"""

from __future__ import annotations

from hasten.profile.loop_kind import image_loader_code, loop_kind, resident_code
from hasten.profile.records import Analysis, Recommendation

MEMORY_SHARE = 0.25  # the dataset fits when it takes at most this share of the device's memory
# What is known is that two reads of one index differ, not what differs: random crops and flips, or a
# random pair (pytorch/examples' siamese_network draws each item's two images and label at random)
FROZEN = ("freezes what each item draws at random (two reads of one index differ): every epoch sees the same "
          "draws (random crops and flips, pairs, noise)")


def _field(d0: dict, key: str):
    """A field of the rank's report, or of its training loader's entry (None where not checked)."""
    if d0.get(key) is not None:
        return d0[key]
    train = [ld for ld in d0.get("loaders", []) if ld.get("training")]
    return train[0].get(key) if train else None


def resident_fixes(a: Analysis, d0: dict, free: float, memory_bytes: float) -> list[Recommendation]:
    """The resident loader (and, for randomly augmented images, its variant augmenting per batch), where
    the dataset fits; predicted at the step with data made free (``free``), held to its bound later."""
    length, batch_size, batch_bytes = d0.get("dataset_len"), d0.get("batch_size"), d0.get("batch_bytes") or 0
    decoded, random = _field(d0, "decoded_sample_bytes"), _field(d0, "random_transforms")
    if not length or not (decoded or (batch_size and batch_bytes)):
        return []
    data_bytes = length * decoded if decoded else length * batch_bytes / batch_size
    size = (f"{data_bytes / 2**20:.0f} MiB ({'decoded items, before their transforms' if decoded else 'as batched'})")
    if data_bytes >= MEMORY_SHARE * memory_bytes:
        return []
    layout = d0.get("batch_layout")
    checked = {True: "; its items are transformed at random (two reads of one index differ)",
               False: "; its items are the same at every read (no random transforms)",
               None: "; whether its transforms are random was not checked"}[random]
    recs = [Recommendation(
        fix="device-resident loader", how=resident_code(layout, a.device), predicted_speedup=a.step_time_s / free,
        changes_math=bool(random), math_note=FROZEN if random else None, apply="resident",
        basis=f"dataset {size} fits; the step with data made free {free * 1e3:.1f} ms{checked}")]
    if random and loop_kind(layout) == "images":
        recs.append(Recommendation(
            fix="decoded images resident, augmentation per step (as hasten's own loaders do)",
            how=image_loader_code(a.device, "Augmentation(translate=4, flip='random')") +
            "\n     # Augmentation: hasten.data.device_loader; its crop is a shift of up to translate pixels, "
            "not a resized crop: match your transforms",
            predicted_speedup=a.step_time_s / free, changes_math=False, apply=None,
            basis=f"the decoded dataset in memory: {size}; at best the step with data made free, "
                  f"{free * 1e3:.1f} ms (the augmentation per batch is not measured)"))
    return recs
