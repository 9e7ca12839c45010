"""What a result was measured on, and with which code: recorded next to every
benchmark and run (hasten version, git commit, command line, software, hardware)."""

from __future__ import annotations

import functools
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from hasten import __version__


def pick_device(requested: str = "auto") -> torch.device:
    """Resolve ``auto|cuda|cpu`` (or any torch device string) to a device."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        from hasten.errors import ConfigError

        raise ConfigError("--device cuda was asked for, but torch sees no CUDA device")
    return dev


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_PACKAGE_DIR = Path(__file__).resolve().parent
_GIT_TIMEOUT_S = 5.0


def _git(directory: Path, *args: str) -> str | None:
    """stdout of ``git -C directory args``, or None on any failure: provenance is
    recorded when it can be, and never stops a run."""
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                              text=True, timeout=_GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):  # git missing, timed out, ...
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def source_revision(directory: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout holding ``directory`` (default: the
    hasten package), or ``(None, None)`` when it is not one or git is missing.

    The package's own ``__init__.py`` must be tracked by that checkout: an
    installed copy that merely sits inside some other repository (a virtual
    environment in a project) does not take that project's commit. ``dirty`` is
    True when ``git status --porcelain`` lists anything (ignored files aside).
    """
    directory = Path(directory) if directory is not None else _PACKAGE_DIR
    if _git(directory, "ls-files", "--error-unmatch", "--", "__init__.py") is None:
        return None, None
    head = _git(directory, "rev-parse", "HEAD")
    if head is None:  # a repository without commits yet
        return None, None
    status = _git(directory, "status", "--porcelain")
    return head.strip(), (bool(status.strip()) if status is not None else None)


def command_line(argv: list[str] | None = None) -> str:
    """The command that started this process, shell-quoted so it can be pasted back.

    Only the program is shortened, so that results copied between machines hold
    no local install path: hasten's console script becomes ``hasten``, its
    ``__main__`` ``python -m hasten``, and a script under the working directory
    its relative path (``benchmarks/speedrun.py``). Arguments stay exactly as given.
    """
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    prog = argv[0]
    path = Path(prog)
    if prog and path.is_absolute():
        if path.resolve() == _PACKAGE_DIR / "__main__.py":
            prog = "python -m hasten"
        elif path.name == "hasten":
            prog = "hasten"
        else:
            try:
                prog = shlex.quote(str(path.resolve().relative_to(Path.cwd().resolve())))
            except ValueError:
                prog = shlex.quote(prog)
    else:
        prog = shlex.quote(prog)
    return " ".join([prog, *(shlex.quote(a) for a in argv[1:])])


def describe_environment(device: torch.device | str | None = None, *,
                         argv: list[str] | None = None) -> dict:
    """A JSON-able description of the code, software and hardware.

    ``hasten`` (version), ``git_commit`` and ``git_dirty`` (None outside a git
    checkout), ``command`` (:func:`command_line` of ``argv``, default
    ``sys.argv``), then python, torch, CUDA, cuDNN, platform, CPU and GPU.
    """
    commit, dirty = source_revision()
    env = {
        "hasten": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "command": command_line(argv),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
    }
    dev = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (dev is None or dev.type == "cuda"):
        idx = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_count"] = torch.cuda.device_count()
    return env


def hardware_label(env: dict) -> str:
    """Short label for tables: the GPU name, else the CPU and its core count."""
    if env.get("gpu"):
        return env["gpu"]
    return f"{env.get('cpu')} ({env.get('cpu_count')} cores)"


def matmul_gflops(device: torch.device | str = "cpu", n: int = 1024, seconds: float = 1.0) -> float:
    """This machine's dense matmul rate now, in GFLOP/s (fp32 on CPU, bf16 on CUDA).

    The scale every timing sits on: shared CPU machines differ by about 1.5x from
    day to day, so a CPU timing is only comparable next to this number. Best of
    repeated ``n x n`` products over about ``seconds`` (the best, not the mean,
    because other load only ever slows it down).
    """
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        n = max(n, 8192)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    from hasten.timing import synchronize

    a @ b  # warm-up: first call allocates and picks kernels
    synchronize(dev)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        a @ b
        synchronize(dev)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() >= deadline:
            break
    return 2 * n**3 / best / 1e9


def scheduling_priority() -> dict:
    """This process's nice value and, on Linux, its autogroup nice (None where absent).

    Linux shares the CPU between autogroups (one per session) before processes, so
    ``nice`` alone does not rank a job against other sessions; the autogroup's does.
    """
    try:
        autogroup = autogroup_nice(Path("/proc/self/autogroup").read_text())
    except OSError:
        autogroup = None
    return {"nice": os.nice(0), "autogroup_nice": autogroup}


def autogroup_nice(text: str) -> int | None:
    """The nice value in a ``/proc/<pid>/autogroup`` line (``/autogroup-7 nice -5``).

    None where the line carries none: kernels built or booted without autogroups
    leave the file empty (seen on CI machines).
    """
    words = text.split()
    try:
        return int(words[words.index("nice") + 1])
    except (ValueError, IndexError):
        return None


class MeasuredConditions:
    """The conditions a benchmark ran under, measured by the benchmark itself.

    Use as a context manager around the measurement; :meth:`as_dict` then gives
    ``load_average_before`` / ``load_average_after`` (1, 5, 15 min), the matmul
    rate before and after, wall seconds, and :func:`describe_environment`. Never
    a hand-written note: a reader sees how busy and how fast the machine was.
    """

    def __init__(self, device: torch.device | str = "cpu", *, argv: list[str] | None = None,
                 seconds: float = 1.0):
        self.device = torch.device(device)
        self.argv = argv
        self.seconds = seconds  # per matmul probe; toy runs (smoke tests) pass less
        self._data: dict = {}

    def __enter__(self) -> "MeasuredConditions":
        self._data["load_average_before"] = list(os.getloadavg())
        # The load average counts other jobs whatever their priority; a benchmark run at a
        # raised scheduling share (Linux autogroup nice < 0) barely feels them, so the
        # share is part of the conditions.
        self._data["cpu_priority"] = scheduling_priority()
        self._data["matmul_gflops_before"] = round(matmul_gflops(self.device, seconds=self.seconds), 1)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._data["wall_s"] = round(time.perf_counter() - self._t0, 2)
        self._data["load_average_after"] = list(os.getloadavg())
        self._data["matmul_gflops_after"] = round(matmul_gflops(self.device, seconds=self.seconds), 1)

    def as_dict(self) -> dict:
        """Conditions measured so far, plus the software and hardware description."""
        return {**self._data, "environment": describe_environment(self.device, argv=self.argv)}

    def summary(self) -> str:
        """One line for a benchmark's printed table."""
        d = self._data
        load = d.get("load_average_before", [float("nan")])[0]
        after = d.get("load_average_after", [float("nan")])[0]
        return (f"conditions: matmul {d.get('matmul_gflops_before', float('nan')):.0f}"
                f"->{d.get('matmul_gflops_after', float('nan')):.0f} GFLOP/s, "
                f"load average {load:.2f}->{after:.2f}")
