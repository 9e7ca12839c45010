"""The real-scripts benchmark's own environment: torch as installed here, plus torchvision, timm, Lightning and hasten.

    python benchmarks/_real_script_env.py [--env DIR]       # creates or completes DIR (prints its python)
    DIR/bin/python benchmarks/profile_real_scripts.py ...  # then run the benchmark from it

The image-training cases (``real_script_cases.py``: ``needs="torchvision"``, ``"timm"``,
``"lightning"``) import packages that hasten does not need and that, installed the ordinary way,
pull a CUDA build of torch over the CPU one. Here they are installed beside the torch of the
Python that runs this script, in a venv of their own (``$HASTEN_REAL_SCRIPTS_ENV``, default
``~/.cache/hasten/real-scripts-env``), never in the user's environment:

1. ``torch==<this torch's version>`` (the same build: pip finds it where it found this one) and
   hasten itself (``pip install -e <this repository>``);
2. ``pip install --no-deps torchvision==0.<minor + 15>`` (torch 2.13 <-> torchvision 0.28: the
   pairing PyTorch publishes; checked against the wheel's own ``Requires-Dist: torch==``). If
   ``import torchvision`` then fails, the two imports of its ``__init__.py`` that register
   operators for torch's tracing (``_meta_registrations``, ``_autograd_registrations``) are removed
   from the installed copy; the transforms, datasets and models the scripts use do not need them;
3. timm, lightning and torchmetrics with ``--no-deps`` (each requires torch and torchvision,
   unpinned) and then their other requirements, which do not touch torch, with tensorboard and
   gymnasium (the makemore and CartPole cases), so that every case runs from this environment.

Without this environment the benchmark skips those cases and says so. The scripts run unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from _common import BENCHMARKS

ROOT = BENCHMARKS.parent
DEFAULT = Path(os.environ.get("HASTEN_REAL_SCRIPTS_ENV") or Path.home() / ".cache" / "hasten" / "real-scripts-env")
PACKAGES = ("torchvision", "timm", "lightning")   # what the cases that need this environment import
# pinned: the versions this benchmark was run with
TIMM, LIGHTNING, TORCHMETRICS = "timm==1.0.31", "lightning==2.6.6", "torchmetrics==1.9.0"
# their requirements other than torch and torchvision (timm: huggingface_hub, pyyaml, safetensors;
# lightning: fsspec, lightning-utilities, packaging, pyyaml, tqdm, typing-extensions; LightningCLI: jsonargparse)
OTHERS = ("huggingface_hub", "pyyaml", "safetensors", "fsspec[http]", "lightning-utilities", "packaging",
          "tqdm", "typing-extensions", "jsonargparse[signatures]>=4.39.0,<4.48.0",
          "tensorboard", "gymnasium")   # the older cases' (makemore logs to TensorBoard; CartPole), so all run here
REGISTRATIONS = re.compile(r"^.*\b(_meta_registrations|_autograd_registrations)\b.*$\n?", re.M)


def skip_reason(case) -> str | None:
    """Why ``case`` (``real_script_cases.Case``) cannot run from the Python running now, or None: a
    package it needs is not importable here."""
    if case.needs and importlib.util.find_spec(case.needs) is None:
        how = ("run the benchmark from the environment of benchmarks/_real_script_env.py"
               if case.needs in PACKAGES else f"pip install {case.needs}")
        return f"needs {case.needs} ({how})"
    return None


def torchvision_for(torch_version: str) -> str:
    """The torchvision release built against a torch release: 2.N <-> 0.(N + 15) since torch 2.0 / 0.15."""
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    if major != 2:
        raise SystemExit(f"_real_script_env: no torchvision pairing known for torch {torch_version}")
    return f"0.{minor + 15}.*"


def _run(*cmd) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), check=True)


def _imports(py: Path, module: str) -> str | None:
    """None if ``import module`` works in ``py``; otherwise the last line of its error."""
    p = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True, text=True)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]


def patch_torchvision(init: Path) -> bool:
    """Remove the two registration imports from an installed torchvision/__init__.py (True if it changed)."""
    text = init.read_text()
    patched = REGISTRATIONS.sub("", text)
    if patched != text:
        init.write_text(patched)
    return patched != text


def build(env: Path) -> Path:
    import torch

    py = env / "bin" / "python"
    if not py.exists():
        _run(sys.executable, "-m", "venv", env)
    pip = (py, "-m", "pip", "install", "--quiet")
    _run(*pip, f"torch=={torch.__version__.split('+')[0]}")
    _run(*pip, "-e", ROOT)
    _run(*pip, "--no-deps", f"torchvision=={torchvision_for(torch.__version__)}")
    requires = " ".join(r for r in subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(*m.requires('torchvision'), sep='\\n')"],
        capture_output=True, text=True, check=True).stdout.splitlines() if re.match(r"torch\s*[(=<>~!]", r))
    if torch.__version__.split("+")[0] not in requires:
        raise SystemExit(f"_real_script_env: the torchvision installed requires {requires}, "
                         f"not torch {torch.__version__}")
    error = _imports(py, "torchvision")
    if error:
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        init = Path(site) / "torchvision" / "__init__.py"
        print(f"import torchvision failed ({error}); removing its registration imports from {init}")
        patch_torchvision(init)
        error = _imports(py, "torchvision")
        if error:
            raise SystemExit(f"_real_script_env: torchvision still fails to import: {error}")
    _run(*pip, "--no-deps", TIMM, LIGHTNING, TORCHMETRICS)
    _run(*pip, *OTHERS)
    for module in ("torchvision", "timm", "lightning", "hasten"):
        error = _imports(py, module)
        if error:
            raise SystemExit(f"_real_script_env: import {module} fails in {env}: {error}")
    versions = subprocess.run([str(py), "-c", "import torch, torchvision, timm, lightning; print(torch.__version__, "
                               "torchvision.__version__, timm.__version__, lightning.__version__)"],
                              capture_output=True, text=True, check=True).stdout.strip()
    print(f"ready: torch, torchvision, timm, lightning = {versions}\n{py}")
    return py


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", type=Path, default=DEFAULT, help="the venv to create or complete")
    try:
        build(ap.parse_args().env.expanduser().resolve())
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"_real_script_env: {' '.join(map(str, e.cmd))} failed (exit {e.returncode}); "
                         "its output is above") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
