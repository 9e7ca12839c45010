"""A public repository at a pinned commit, in a cache outside this repository.

First from GitHub (``git clone`` then ``git checkout <commit>``); where the network is closed,
from a local bare mirror: ``$HASTEN_MIRRORS/<owner>+<name>/repo`` (default ``../.mirror``
beside the checkout, where this project's workplace keeps its mirrors; any folder of bare
clones laid out that way will do). The cache is ``$HASTEN_REAL_SCRIPTS_CACHE`` (default
``~/.cache/hasten/real-scripts``), one folder per repository and commit, reused on reruns.
The scripts' code never enters this repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CHECKOUT_ROOT = Path(__file__).resolve().parent.parent
MIRRORS = Path(os.environ.get("HASTEN_MIRRORS") or CHECKOUT_ROOT.parent / ".mirror")
CACHE = Path(os.environ.get("HASTEN_REAL_SCRIPTS_CACHE") or Path.home() / ".cache" / "hasten" / "real-scripts")


def _git(*args, cwd=None, timeout=120) -> None:
    subprocess.run(["git", "-c", "advice.detachedHead=false", *args], cwd=cwd, check=True, timeout=timeout,
                   capture_output=True, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})


def checkout(repo: str, commit: str) -> tuple[Path, str]:
    """(the work tree at ``commit``, where it came from: "github" or "mirror")."""
    dest = CACHE / f"{repo.replace('/', '+')}@{commit[:12]}"
    marker = dest / ".hasten-fetched"
    if marker.exists():
        return dest, marker.read_text().strip()
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    origin = None
    for source, url in (("github", f"https://github.com/{repo}.git"),
                        ("mirror", str(MIRRORS / repo.replace("/", "+") / "repo"))):
        try:
            _git("clone", "--quiet", "--no-checkout", url, str(dest))
            _git("checkout", "--quiet", commit, cwd=dest)
            origin = source
            break
        except (subprocess.SubprocessError, OSError):
            shutil.rmtree(dest, ignore_errors=True)
    if origin is None:
        raise RuntimeError(f"could not fetch {repo} at {commit}: no network and no mirror at {MIRRORS}")
    marker.write_text(origin + "\n")
    return dest, origin
