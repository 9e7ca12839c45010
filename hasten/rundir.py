"""Run directories: config, environment, metrics (JSON lines), results and plots.

Every command that trains or benchmarks writes one, so a result can always be
traced back to the exact configuration, code and software it came from:
``environment.json`` records the hasten version, the git commit of the hasten
source tree and whether it had uncommitted changes (null outside a checkout),
the command line, and the software and hardware (see
:func:`hasten.environment.describe_environment`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from hasten.environment import describe_environment


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    return str(obj)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write JSON atomically (temp file + rename): readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(_jsonable(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


class RunDir:
    """``runs/<command>-<UTC timestamp>/`` holding config.json, environment.json,
    metrics.jsonl, results.json and plots.

    ``root`` defaults to ``$HASTEN_RUNS``, else ``runs``. ``environment.json`` is
    written at once, so even a run that crashes says what code and command it was.
    """

    def __init__(self, command: str, root: str | os.PathLike | None = None, device=None):
        root = Path(root if root is not None else os.environ.get("HASTEN_RUNS", "runs"))
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = root / f"{command}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = root / f"{command}-{stamp}-{n}"
        path.mkdir(parents=True)
        self.path = path
        self.environment = describe_environment(device)
        write_json(path / "environment.json", self.environment)
        self._metrics = open(path / "metrics.jsonl", "a", buffering=1)

    def write_config(self, config: dict) -> None:
        write_json(self.path / "config.json", config)

    def log(self, **record: Any) -> None:
        """Append one JSON line to metrics.jsonl (line-buffered: survives a crash)."""
        self._metrics.write(json.dumps(_jsonable(record)) + "\n")

    def write_results(self, results: dict) -> Path:
        return write_json(self.path / "results.json", results)

    def close(self) -> None:
        self._metrics.close()

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
