"""Run directories: config, environment, metrics (JSON lines), results and plots.

Every command that trains or benchmarks writes one, so a result can always be
traced back to the exact configuration, code and software it came from:
``environment.json`` records the hasten version, the git commit of the hasten
source tree and whether it had uncommitted changes (null outside a checkout),
the command line, and the software and hardware (see
:func:`hasten.environment.describe_environment`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
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


def runs_root() -> Path:
    """Where run directories go: ``$HASTEN_RUNS``, else ``runs``."""
    return Path(os.environ.get("HASTEN_RUNS", "runs"))


def config_digest(config: dict, length: int = 10) -> str:
    """A short hex digest of ``config`` (JSON with sorted keys): the same settings give
    the same digest in every process and on every machine."""
    text = json.dumps(_jsonable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def stable_run_path(command: str, config: dict, root: str | os.PathLike | None = None) -> Path:
    """``<root>/<command>-<config digest>``: a run directory every process of a run, and
    every restart of it, derives alone from the run's settings, with no file or
    message passed between them (see :func:`config_digest`)."""
    return Path(root if root is not None else runs_root()) / f"{command}-{config_digest(config)}"


class RunDir:
    """``runs/<command>-<UTC timestamp>/`` holding config.json, environment.json,
    metrics.jsonl, results.json and plots.

    ``root`` defaults to ``$HASTEN_RUNS``, else ``runs``. ``path`` names the
    directory instead (made if missing, reused if present: a resumed run appends to
    its metrics). ``environment.json`` is written at once, so even a run that
    crashes says what code and command it was.

    A command that fails before it logs anything leaves no run directory behind:
    ``close(failed=True)`` (and leaving a ``with`` block by an exception, Ctrl-C
    included) removes the directory if this object made it and it holds nothing
    but the empty metrics file, config and environment, and the folders it made to
    hold it (``runs/``) if they are left empty.
    """

    # What a run directory holds before its command has produced anything.
    BARE = frozenset({"environment.json", "config.json", "metrics.jsonl"})

    def __init__(self, command: str, root: str | os.PathLike | None = None, device=None, *,
                 path: str | os.PathLike | None = None):
        if path is None:
            root = Path(root) if root is not None else runs_root()
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            path = root / f"{command}-{stamp}"
            n = 1
            while path.exists():
                n += 1
                path = root / f"{command}-{stamp}-{n}"
        path = Path(path)
        # The directories this makes, innermost first: a failed command removes them if left empty.
        self._made = [d for d in (path, *path.parents) if not d.exists()]
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.environment = describe_environment(device)
        write_json(path / "environment.json", self.environment)
        self._metrics = open(path / "metrics.jsonl", "a", buffering=1)
        self.logged = False

    def write_config(self, config: dict) -> None:
        write_json(self.path / "config.json", config)

    def log(self, **record: Any) -> None:
        """Append one JSON line to metrics.jsonl, flushed at once: a reader (``tail -f``,
        a dashboard) sees it now, and it survives a crash."""
        self._metrics.write(json.dumps(_jsonable(record)) + "\n")
        self._metrics.flush()
        self.logged = True

    def drop_metrics_after(self, step: int, key: str = "step") -> None:
        """Forget metrics lines logged after ``step`` (their ``key``): a run resumed from
        a checkpoint at ``step`` logs those steps again, and each should appear once."""
        self._metrics.close()
        path = self.path / "metrics.jsonl"
        kept = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the crash
                continue
            if not (isinstance(record, dict) and isinstance(record.get(key), (int, float))
                    and record[key] > step):
                kept.append(line)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
        self._metrics = open(path, "a", buffering=1)

    def write_results(self, results: dict) -> Path:
        return write_json(self.path / "results.json", results)

    def close(self, failed: bool = False) -> None:
        """Close the metrics file; with ``failed``, remove the directory if it is bare
        (see the class docstring)."""
        self._metrics.close()
        if failed and self._made and self._bare():
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self._made[1:]:
                try:
                    parent.rmdir()  # only while empty: another run may have started in it
                except OSError:
                    break

    def _bare(self) -> bool:
        try:
            entries = list(self.path.iterdir())
            return (all(e.name in self.BARE and e.is_file() for e in entries)
                    and (self.path / "metrics.jsonl").stat().st_size == 0)
        except OSError:
            return False

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)


class RunJournal:
    """The finished runs of a long sweep, one JSON line each, so that a sweep stopped
    part way (a crash, a reboot, Ctrl-C) resumes where it was instead of starting again.

    ``run(key, fn)`` returns the stored result of ``key`` if this journal holds one
    written under the same ``config`` (its :func:`config_digest`: put in it what the
    results depend on, the hardware for timings), else calls ``fn()``
    and appends its result before returning it. Lines of another configuration are
    kept but never reused; a last line cut off mid-write is skipped and counted
    (``torn``). ``path=None`` journals nothing. A sweep whose later choices depend on
    earlier results (the best learning rate, a target set from the baseline) replays
    them from the journal, so it takes the same path as the run that wrote it.
    """

    def __init__(self, path: str | os.PathLike | None, config: dict, meta: dict | None = None):
        self.path = None if path is None else Path(path)
        self.digest = config_digest(config, length=16)
        self.meta = _jsonable(meta or {})  # written with each line (the code's commit, say); not part of the key
        self.replayed_meta: list[dict] = []  # the distinct metas of the lines taken from the file
        self._done: dict[str, Any] = {}
        self.resumed = self.torn = self.other_config = 0
        self._cut = False  # the file ends inside a line: the next line must start on a new one
        if self.path is not None and self.path.exists():
            text = self.path.read_text()
            self._cut = bool(text) and not text.endswith("\n")
            for line in text.splitlines():
                try:
                    entry = json.loads(line)
                    digest, key, result = entry["config"], entry["key"], entry["result"]
                except (ValueError, KeyError, TypeError):
                    self.torn += 1
                    continue
                if digest == self.digest:
                    self._done[key] = result
                    if entry.get("meta", {}) not in self.replayed_meta:
                        self.replayed_meta.append(entry.get("meta", {}))
                else:
                    self.other_config += 1

    def __len__(self) -> int:
        return len(self._done)

    def __contains__(self, key: str) -> bool:
        return key in self._done

    def run(self, key: str, fn) -> Any:
        if key in self._done:
            self.resumed += 1
            # A fresh copy each time: callers annotate results, and a replay must not see that.
            return json.loads(json.dumps(self._done[key]))
        result = _jsonable(fn())
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"config": self.digest, "key": key, "result": result, "meta": self.meta},
                              separators=(",", ":"))
            with open(self.path, "a") as f:
                f.write(("\n" if self._cut else "") + line + "\n")
                f.flush()
                os.fsync(f.fileno())  # a finished run survives a power cut, not just a crash
            self._cut = False
        self._done[key] = result
        return json.loads(json.dumps(result))
