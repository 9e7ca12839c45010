"""What a result was measured on: recorded next to every benchmark and run."""

from __future__ import annotations

import os
import platform
import socket
import sys

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


def describe_environment(device: torch.device | str | None = None) -> dict:
    """A JSON-able description of software and hardware."""
    env = {
        "hasten": __version__,
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
