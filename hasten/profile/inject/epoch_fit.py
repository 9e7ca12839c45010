"""The replayed steps fit inside the training loader's pass: a loop never gets more batches than ``len(loader)``.

In the replayed steps, each batch the loop draws from its training loader is a copy of the kept
one, and the loader's own iterator stands still. Left at that, a pass never ends: a loop of a
37-batch epoch got a 38th batch and more, and loops trust ``len(loader)``: timm's
``train_one_epoch`` sets its accumulation count to ``len(loader) % accum_steps`` (0) at its last
batch and divides by it at the next (``ZeroDivisionError``, 4 runs of 4); ``OneCycleLR`` built
with ``total_steps = epochs * len(loader)`` raises when stepped once more; an ``i < len(loader)``
check, a progress bar, the last batch's logic all go wrong.

So (issue 43):

- a replayed batch is handed out only while the pass has batches left: past them the iterator
  ends the pass (``StopIteration``) on time, as it would have (:mod:`hasten.profile.inject.loader`);
- the replayed steps start where they fit (:func:`fits`): in the pass under way when it has the
  batches they take, else at the start of the next pass, the steps in between run as the
  loop's own and are not recorded (phase ``epoch_wait``);
- where a whole pass is shorter than they take (:func:`plan`), they are fewer (at least
  :data:`MIN_PROBE_STEPS` of each kind), then the autocast probe and DDP's are skipped, then
  the replay itself, each said in one line and in the report's dropped probes.

The batches of a pass are ``len(loader)`` as the loop reads it: an ``IterableDataset`` without a
length has no known end, and its loop cannot read one either; it is replayed as before.

Changes the training math: no.
"""

from __future__ import annotations

import math

from hasten.profile.inject import messages, probes
from hasten.profile.inject.state import State, is_training_loader

# The first replayed step of each kind is left out (it warms up what changed): two give one value.
MIN_PROBE_STEPS = 2
# The probes a pass too short for every kind loses first, in this order.
SKIP_ORDER = ("autocast", "comm")
NO_LIMIT = 2**62  # batches left where no length is known


def handed(it) -> int:
    """Batches the loop has had from iterator ``it`` in its current pass (its own and replayed ones)."""
    return it.__dict__.get("_hasten_handed", 0)


def pass_length(it, unknown=None):
    """Batches in a pass of iterator ``it``, as ``len(loader)`` tells the loop; ``unknown`` for an
    IterableDataset without a length. Read without calling ``len(loader)``, which for an
    IterableDataset records the length and warns later when more items come."""
    from torch.utils.data import IterableDataset
    owner = getattr(it, "_hasten_owner", None)
    if owner is not None and isinstance(getattr(owner, "dataset", None), IterableDataset):
        try:
            n = len(owner.dataset)
        except TypeError:
            return unknown
        size = getattr(owner, "batch_size", None)
        if not size:
            return n
        return n // size if getattr(owner, "drop_last", False) else math.ceil(n / size)
    try:
        return len(it)
    except TypeError:
        return unknown


def _batches_per_step(st: State) -> int:
    """The training loader's batches in a step: the most any measured step drew (gradient accumulation)."""
    return max([r.get("micro") or 1 for r in st.records["measure"] if r.get("via_loader")] or [1])


def _lengths(st: State) -> tuple[int, int] | None:
    """(batches left to hand out before the loop's next step, batches in a whole pass), the least over
    the ranks; None without a training loader of known length (nothing to fit in)."""
    it = st.train_iter[0] if st.train_iter is not None else None
    trains = any(is_training_loader(st, lid) for lid in st.loaders)
    n = pass_length(it) if it is not None and trains else None
    # (every rank takes part in the reduction, one without a limit with NO_LIMIT)
    left = NO_LIMIT if n is None else n - handed(it)
    # the pass ended with the last step: the next step draws from a fresh pass
    left, n = _least_over_ranks(st, (left if left > 0 else n, NO_LIMIT if n is None else n))
    return None if n == NO_LIMIT else (left, n)


def needed(st: State, kinds: int) -> int:
    return kinds * st.probe_steps * _batches_per_step(st)


def plan(st: State, replay_kinds) -> None:
    """Before the replayed steps: where a whole pass is shorter than they take, fewer of them, then
    fewer kinds, then none, each said in one line. ``replay_kinds(st)``: the kinds they interleave."""
    lengths = _lengths(st)
    if lengths is None:
        return
    _, n = lengths
    per_step = _batches_per_step(st)
    while replay_kinds(st) and needed(st, len(replay_kinds(st))) > n:
        kinds = replay_kinds(st)
        fewer = n // (len(kinds) * per_step)
        short = f"a pass of the training loader is {_batches(n)} (len(loader)), and hasten hands a loop no more"
        if fewer >= MIN_PROBE_STEPS:
            messages.say(st, f"{short}: {fewer} replayed steps of each kind instead of {st.probe_steps}")
            st.probe_steps = fewer
            break
        optional = next((p for p in SKIP_ORDER if p in st.probes and any(probes.PROBE_OF_KIND.get(k) == p
                                                                        for k in kinds)), None)
        probe = optional or "replay"
        least = len(kinds) * MIN_PROBE_STEPS * per_step
        probes.drop(st, probe, f"skipped: {short}, fewer than the {least} that {MIN_PROBE_STEPS} replayed steps "
                               f"of each of {len(kinds)} kind{'s' if len(kinds) != 1 else ''} take")
    if not replay_kinds(st):
        return
    left, _ = lengths
    need = needed(st, len(replay_kinds(st)))
    if left < need:
        messages.say(st, f"the replayed steps wait for the training loader's next pass: {_batches(left)} left "
                         f"in this one, they take {need}")


def _batches(n: int) -> str:
    return f"{n} batch" if n == 1 else f"{n} batches"


def fits(st: State, kinds: int) -> bool:
    """Whether the replayed steps, ``kinds`` interleaved kinds of them, fit in the batches the loop
    can still be handed before its pass ends (every rank agreeing)."""
    lengths = _lengths(st)
    return lengths is None or lengths[0] >= needed(st, kinds)


def _least_over_ranks(st: State, values: tuple[int, ...]) -> tuple[int, ...]:
    """``values``, each the least over the ranks (the ranks' replayed steps must stay in line)."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return values
    ar = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)  # hasten's, not the loop's communication
    t = torch.tensor(values, dtype=torch.int64, device="cuda" if st.device == "cuda" else "cpu")
    ar(t, op=dist.ReduceOp.MIN)
    return tuple(int(v) for v in t.tolist())
