"""The model an input fix is predicted with: the step as a function of its loader's workers and echoing.

From the run's own measurements (:func:`input_model`): T the step, D its data wait, T_free the
step with its data made free (:func:`hasten.profile.attribution.data_free_step`), k the training
loader's batches per optimizer step, P one producer's time for a step's batches (the loader
probe's; without it, at least the workers' CPU), c their CPU (the workers' /proc times, or for a
loop without workers the main process's CPU outside compute), m the main process's
other CPU per step, C the cores measured available. With w workers and echo factor e:

    step = max(T_free + hand-off + (receive + delay) / e,  P / (e w),  (c / e + m) / C)

the step's own work with what each batch costs it on its way in (the loop's CPU receiving it
from a worker, and the workers' CPU on the step's cores: :func:`hasten.profile.attribution.cpu_use`),
the producers' pace, or the CPU all of it needs. Made in the loop (w = 0), the step is T_free
plus at most the workers' CPU for its batches, at the rate the loop's thread gets a core, and no
less than the CPU all of it needs, (c / e + m - receive) / C.

Changes the training math: no (analysis only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hasten.profile.records import Analysis, RankSummary


@dataclass(frozen=True)
class InputModel:
    step: float  # T, as measured
    data: float  # D, the data wait per step
    free: float  # T_free, the step with its data made free
    batches_per_step: float  # k
    workers: int  # the training loader's workers now (0: made in the loop)
    cores: float  # C
    producer: float  # P
    data_cpu: float  # c
    main_cpu: float  # m
    receive: float  # the loop's CPU taking a step's batches from the workers
    delay: float  # what the workers' CPU on the step's cores costs it
    handoff: float  # a step's batches through a worker, where there are none now
    thread_rate: float  # of a core, what the loop's thread gets
    now: float  # the step as run in this model: a fix gains what it changes in the model

    def step_with(self, workers: int, echo: float = 1.0) -> tuple[float, str]:
        """The step with ``workers`` workers and each batch used ``echo`` times, and what sets it."""
        if workers == 0:
            # the CPU all of it needs holds here too: the reference, with workers, is held to it, and a
            # fix measured against that limit without its own gained what the limit took (kuangliu/
            # pytorch-cifar on 0.75 cores: num_workers=0 predicted x1.41 against x1.06 with it)
            parts = {"making the batches in the loop": self.free + self.data_cpu / echo / self.thread_rate,
                     "CPU": (self.data_cpu / echo + self.main_cpu - self.receive) / self.cores}
        else:
            parts = {"rest of the step": self.free + self.handoff + (self.receive + self.delay) / echo,
                     "producers": self.producer / echo / workers,
                     "CPU": (self.data_cpu / echo + self.main_cpu) / self.cores}
        limit = max(parts, key=parts.get)
        return parts[limit], limit

    def speedup(self, step: float) -> float:
        return self.now / max(step, 1e-12)

    def against(self) -> str:
        """What a predicted step is set against: the step as run, or the model's where its CPU is more."""
        return (f"against {self.now * 1e3:.1f} ms as run in the same model (the CPU is contended; "
                f"{self.step * 1e3:.1f} ms measured)" if self.now != self.step
                else f"against {self.step * 1e3:.1f} ms as run")

    def basis(self, workers: int, echo: float = 1.0) -> str:
        step, limit = self.step_with(workers, echo)
        against = self.against()
        return (f"one producer makes a step's {self.batches_per_step:g} batch(es) in {self.producer * 1e3:.1f} ms "
                f"({self.data_cpu * 1e3:.1f} ms CPU), main process {self.main_cpu * 1e3:.1f} ms CPU per step, "
                f"{self.cores:.2f} cores available (measured), {self.handoff * 1e3:.2f} ms hand-off; step "
                f"{step * 1e3:.1f} ms, set by {limit}, {against}; the step with data made free: "
                f"{self.free * 1e3:.1f} of {self.step * 1e3:.1f} ms")


def input_model(a: Analysis, s: RankSummary) -> InputModel:
    """The model of this run (see the module), from its analysis and rank 0's summary."""
    t = a.step_time_s
    data = a.data_wait_fraction * t
    free = a.data_free_step_s if a.data_free_step_s is not None else t - data
    k = max(1.0, s.micro)
    workers = a.num_workers if a.loader_driven else 0
    cores = a.cpu.get("available") or 1.0
    if a.loader_driven and workers and a.loader_batch_s:
        producer = a.loader_batch_s * workers * k  # one worker's time for one step's batches
        data_cpu = (s.worker_cpu_per_batch_s or 0.0) * k
    elif a.loader_driven and workers and s.worker_cpu_per_batch_s:
        # The loader probe did not run (off, or dropped): the workers' CPU over the window, which a
        # worker's time for a batch is at least. The loop's own CPU is only its receiving them
        # (kuangliu/pytorch-cifar's 2 workers: 1.8 ms of it a step against their 19 ms: num_workers=0 was
        # predicted x2.07 where the model with their CPU has it slower than as run).
        producer = data_cpu = s.worker_cpu_per_batch_s * k
    else:
        producer = data  # made in the loop: the wait is the production time
        # the loop's CPU outside compute, in the share of that time spent making the batch
        data_cpu = min((s.data_cpu_s or 0.0) * data / max(data + a.other_fraction * t, 1e-12), data)
    data_cpu = min(data_cpu, producer)
    main_cpu = max(0.0, (s.cpu_s or 0.0) - (0.0 if workers else data_cpu))
    # With workers: the loop's CPU taking each batch from them (its time in the loader, where they are
    # ahead), and what their CPU on the step's own cores costs it. Both go with the batches: more
    # workers keep them, fewer batches (echoing) divide them, none removes them.
    receive = min(s.data_cpu_s or 0.0, data) if workers else 0.0
    delay = a.cpu.get("data_cpu_delay_s", 0.0) if workers else 0.0
    if workers and a.cpu.get("step_cpu_per_step_s") is not None:
        # the step's own CPU from its replay: the measured steps' counts threads spinning at barriers
        main_cpu = a.cpu["step_cpu_per_step_s"] + receive
    model = InputModel(step=t, data=data, free=free, batches_per_step=k, workers=workers, cores=cores,
                       producer=producer, data_cpu=data_cpu, main_cpu=main_cpu, receive=receive, delay=delay,
                       handoff=(s.handoff_s or 0.0) * k if not workers else 0.0,
                       thread_rate=a.cpu.get("thread_rate", 1.0), now=t)
    # Where the CPU the model adds up is more than the step took, the model's step as run is the
    # reference: a fix gains what it changes in the model, not the gap between the model and the clock.
    if a.cpu.get("contended") and workers:
        model = replace(model, now=max(t, model.step_with(workers)[0]))
    return model
