"""What one instrumented process has seen so far: steps, phases, loaders, the model, probes.

One :class:`State` per process, in :data:`current` once :func:`hasten.profile.inject.install`
has run (``None`` before, and in a process that is not profiled). Every hook reads it
from here, so that a hook left behind by a torch patch does nothing without it.

Changes the training math: no.
"""

from __future__ import annotations

import threading
import time

from hasten.profile.inject.settings import Settings

# A step of each kind goes into its own list: warm-up (discarded), the measured window, and
# the replayed steps of the probes.
RECORDS = ("warmup", "measure", "step_alone", "comm_off", "comm_bf16", "autocast")


class State:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dir = settings.dir
        self.rank = settings.rank
        self.world_size = settings.world_size
        self.warmup = settings.warmup
        self.steps = settings.steps  # replaced from the warm-up's step time under --seconds; doubled by the
        self.extended = 0  # stopping rule (phases._measure_on), this many times
        self.measure_t0 = 0.0
        self.probe_steps = settings.probe_steps
        self.probes = set(settings.probes)  # the probes still to run (a failing one is dropped)
        self.apply = settings.apply
        self.apply_error: str | None = None  # the fix of a verification run could not be applied: why
        self.t_start = time.perf_counter()
        self.phase = "warmup"
        self.phase_step = 0  # steps completed in the current phase
        self.steps_seen = 0  # steps of the primary optimizer (or backward() calls: `pace`)
        self.primary_opt: int | None = None
        # what ends a step: "optimizer" steps, or "backward" calls where no optimizer was built
        # ("unknown" until the first backward() returns or an optimizer steps)
        self.pace = "unknown"
        self.optimizers_built = 0
        self.records: dict[str, list[dict]] = {p: [] for p in RECORDS}
        self.step_kind = "warmup"
        # the open step ("span"): from the previous step's end to this one's
        self.span: dict | None = None
        self.cdepth = 0  # nesting of compute intervals
        self.c_t0 = 0.0
        self.c_cpu0 = 0.0
        self.c_end: float | None = None  # when the outermost compute interval last closed, until its hook returns
        self.has_params: dict[int, bool] = {}
        # loaders: id -> {"name", "batches", "train_votes", "eval_votes", "workers", "pids", "iters", ...}
        self.loaders: dict[int, dict] = {}
        self.last_loader: int | None = None  # the loader whose batch awaits a forward
        self.train_iter = None  # (iterator, its original __next__): the latest of a training loader
        self.cached = None  # a copy of a training loader's batch, replayed in the probes
        self.cached_copy = False  # whether `cached` is that copy yet (else the first batch seen, as it is)
        self.cached_bytes = 0
        self.batch_layout: list[dict] = []  # the training batch's tensors: shape, dtype (batches.tensor_layout)
        self.model_id: int | None = None  # the first module with parameters called in training mode
        self.model_ref = None  # a weak reference to it
        self.model_args = None  # a copy of the first data that reached its forward (positional arguments)
        self.replay_args = False  # replayed steps hand the model `model_args` (a loop without a DataLoader)
        self.opt_depth = 0  # compute depth of an optimizer step in progress (forwards in a closure are at it)
        self.in_probe = False  # hasten's own isolated probe is running: the hooks do not count it
        self.dropped: list[dict] = []  # probes dropped: {"probe", "why"}
        self.hasten_error: str | None = None  # hasten's own code failed here: profiling is off
        self.autocast_ctx = None  # bf16 autocast entered around a top-level forward (probe or fix)
        self.autocast_depth = 0  # the compute depth it was entered at
        self.forwards = 0
        self.train_forwards = 0
        self.backwards = 0
        self.eval_counts: list[int] = []
        self.ddp = []
        self.user_hook = None
        self.bf16_state = None
        self.comm_mode = "real"
        self.grad_bytes = 0
        self.allreduce_times: list[tuple[float, float]] = []
        self.allreduce_bf16_times: list[tuple[float, float]] = []
        self.bf16_cast_s = 0.0
        self.loader_probe: dict = {}
        self.worker_cpu: dict = {}  # measure phase: worker CPU seconds and training batches
        self.device = "cpu"
        self.finished = False
        self.error: str | None = None
        self.samples: dict[str, int] = {}
        self.n_samples = 0
        self.data_samples: dict[str, int] = {}  # sampled outside compute inside a step: where data is made
        self.n_data_samples = 0
        # the measured window's samples outside compute: "loader", "batch" or "other" (sampler.attribute)
        self.outside_counts: dict[str, int] = {}
        self.line_samples: dict[str, dict[str, int]] = {}  # kind -> {"file.py:line": samples}
        self.line_info: dict[str, dict] = {}  # "file.py:line" -> {"function", "code"}
        self.batch_lines: dict | None = None  # code object -> lines that make the batch (batch_source)
        self.batch_fn_shape: dict = {}  # what it does with its data (batch_shape.function_shape)
        self.batch_fn_code = None  # the code of the script's batch function, whose calls are timed (batch_fn)
        self.batch_fn_result = None  # a copy of one of its results, for the hand-off and hand-out probes
        self.batch_call_only = False  # the lines that make the batch only call it (batch_source.only_the_call)
        self.cpu_window: dict = {}  # the measured window's cores: allowed, ours, other processes', free
        self.bf16: dict = {}  # native bf16 as torch and the CPU say, and the timed products (autocast_check)
        self.threads: dict = {}  # torch's thread counts as the script set them, and whether a probe changed them
        self.lock = threading.Lock()


current: State | None = None


def is_training_loader(st: State, lid: int) -> bool:
    """Whether loader ``lid``'s batches went into more training-mode forwards than eval-mode ones."""
    d = st.loaders.get(lid)
    return d is not None and d["train_votes"] > d["eval_votes"]
