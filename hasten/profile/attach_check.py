"""Which Pythons of a profiled command attached, and, for one that cannot, why, within seconds.

Every Python that loads hasten reports in at start-up (:mod:`hasten.profile.attach`
writes ``attached-<pid>.json``). The launcher's :class:`AttachCheck` reads the command's
processes from ``/proc`` (its session, and its descendants that left it) twice a second;
a Python process (``/proc/<pid>/exe`` named ``python*``) that has not reported in
``grace_s`` seconds after it first showed is looked at once, in this order:

1. its argv: ``-S`` skips site-packages and sitecustomize, so hasten cannot load;
2. its environment (``/proc/<pid>/environ``): without ``HASTEN_PROFILE_DIR`` (``env -i``,
   ``sudo``) it cannot know it is profiled;
3. its executable: a statically linked Python (no ELF program interpreter) is named as
   such and not run;
4. the interpreter itself, asked with the process's own flags, environment and folder:
   can it import hasten, and has its site-packages hasten's ``.pth``? A Python without
   hasten under ``-I``/``-E`` (which ignore ``PYTHONPATH``) or under a ``PYTHONPATH`` the
   command replaced, or a hasten installed without the ``.pth``, is named with the fix.

A Python that reported in is attached whatever it does next (``torchrun``'s own process
and a Makefile's ``python -c 'print(1)'`` never step, and that is fine). A silent Python
with no cause found (one still starting, say) is only listed in the launcher's stall and
timeout messages. Linux only: elsewhere ``/proc`` is absent and nothing is checked.

Changes the training math: no.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from hasten.cpu_time import PPID, SESSION, pid_stat
from hasten.profile.attach import ENV_DIR, PTH_NAME
from hasten.profile.outcome import read_json_files

_PYTHON_NAME = re.compile(r"python[0-9.]*[a-z]?")
PT_INTERP = 3  # the ELF program header of a dynamically linked executable's loader

# Asked of a silent Python's interpreter: can it import hasten, and does it read hasten's .pth?
_PROBE = (
    "import importlib.util, json, os, site, sys\n"
    "sys.path = [p for p in sys.path if p]\n"  # -c's '' (the folder) is not on the script's path
    "dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])\n"
    "print(json.dumps({'hasten': importlib.util.find_spec('hasten') is not None,\n"
    f"                  'pth': any(os.path.exists(os.path.join(d, {PTH_NAME!r})) for d in dirs)}}))\n"
)


class AttachCheck:
    """The Pythons of the command started under ``root``: which reported in, and why one cannot."""

    def __init__(self, root: int, report_dir: Path, site_dir: Path, grace_s: float = 3.0) -> None:
        self.root, self.report_dir, self.site_dir, self.grace_s = root, report_dir, str(site_dir), grace_s
        self.first_seen: dict[tuple[int, str], float] = {}  # (pid, command line) -> when first seen as a Python
        self.judged: set[tuple[int, str]] = set()
        self.unexplained: dict[int, str] = {}  # silent Pythons with no cause found: pid -> command line
        self.pythons: set[int] = set()

    def attached(self) -> list[dict]:
        """Each report-in: pid, how it attached (``pth`` or ``sitecustomize``), executable, argv."""
        return read_json_files(self.report_dir, "attached-*.json")

    def poll(self) -> list[str]:
        """One line for each Python that has been silent for ``grace_s`` and cannot attach (each said once)."""
        now = time.monotonic()
        attached = self._attached_pids()
        self.pythons |= attached
        lines = []
        for pid in command_processes(self.root):
            exe = python_executable(pid)
            if exe is None or pid in attached:
                continue
            self.pythons.add(pid)
            argv = _read_list(f"/proc/{pid}/cmdline")
            if argv is None:
                continue
            key = (pid, "\0".join(argv))
            if now - self.first_seen.setdefault(key, now) < self.grace_s or key in self.judged:
                continue
            self.judged.add(key)
            cause = diagnose(pid, exe, argv, self.site_dir)
            if cause:
                lines.append(cause)
            else:
                self.unexplained[pid] = _shown(argv)
        return lines

    def summary(self) -> str:
        """For the stall and timeout messages: no Python at all, or the ones still silent."""
        attached = self._attached_pids()
        if not self.pythons | attached:
            if not os.path.isdir("/proc"):
                return ""  # nothing watched: no telling
            return ("no Python process has run in the command (a Python inside a container is not one of its "
                    "processes: hasten cannot attach to it)")
        silent = [f"process {pid} (`{cmd}`)" for pid, cmd in self.unexplained.items() if pid not in attached]
        return f"not attached, cause unknown: {', '.join(silent)}" if silent else ""

    def _attached_pids(self) -> set[int]:
        # From the names alone: a long run's forked DataLoader workers leave hundreds of files.
        return {int(p.name[len("attached-"):-len(".json")]) for p in self.report_dir.glob("attached-*.json")}


def command_processes(root: int) -> list[int]:
    """``root``'s session (the launcher starts the command in a new one) and its descendants that left it."""
    stats = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            st = _ppid_session(int(name))
            if st is not None:
                stats[int(name)] = st
    members = {pid for pid, (_, sid) in stats.items() if sid == root}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        members.add(pid)
        todo += [c for c in children.get(pid, []) if c not in members]
    return sorted(members)


def python_executable(pid: int) -> str | None:
    """The process's executable when it is a Python (named ``python``, ``python3.11``, ...), else None."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None
    return exe if _PYTHON_NAME.fullmatch(os.path.basename(exe)) else None


def interpreter_flags(argv: list[str]) -> set[str]:
    """The one-letter options before the script, ``-c`` or ``-m``: ``{'u', 'I'}`` for ``python -uI train.py``."""
    flags: set[str] = set()
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-", "--") or not arg.startswith("-"):
            break
        if arg.startswith("--"):
            if arg == "--check-hash-based-pycs":
                next(args, None)
            continue
        for i, ch in enumerate(arg[1:]):
            if ch in "cm":
                return flags
            if ch in "WX":  # their value follows, in this argument or the next
                if i == len(arg) - 2:
                    next(args, None)
                break
            flags.add(ch)
    return flags


def is_static_elf(path: str) -> bool:
    """An ELF executable without a program interpreter (no ``PT_INTERP``): statically linked."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF":
                return False
            order = "<" if head[5] == 1 else ">"
            wide = head[4] == 2  # 64-bit: a wider e_phoff, and the fields after it further on
            (phoff,) = struct.unpack_from(order + ("Q" if wide else "I"), head, 32 if wide else 28)
            phentsize, phnum = struct.unpack_from(order + "HH", head, 54 if wide else 42)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            types = [struct.unpack_from(order + "I", table, i * phentsize)[0] for i in range(phnum)]
    except (OSError, struct.error):
        return False
    return PT_INTERP not in types


def diagnose(pid: int, exe: str, argv: list[str], site_dir: str) -> str | None:
    """Why the silent Python ``pid`` cannot attach, as one line with what to do; None when no cause is found."""
    who = f"cannot attach to process {pid} (`{_shown(argv)}`)"
    flags = interpreter_flags(argv)
    if "S" in flags:
        return (f"{who}: -S skips site-packages and sitecustomize, through which hasten loads itself into a "
                f"Python; run it without -S")
    environ = _read_list(f"/proc/{pid}/environ")
    env = dict(kv.split("=", 1) for kv in environ if "=" in kv) if environ is not None else None
    if env is not None and ENV_DIR not in env:
        return (f"{who}: {ENV_DIR} is not in its environment (the command cleared it, as `env -i` and `sudo` do); "
                f"let the HASTEN_PROFILE_* variables through")
    if is_static_elf(f"/proc/{pid}/exe"):
        return (f"{who}: {exe} is a statically linked Python and did not load hasten at start-up (from a "
                f"site-packages .pth or a sitecustomize on PYTHONPATH); run the command with a dynamically linked "
                f"CPython that has hasten installed")
    interp = _interpreter(pid, argv, exe, env)
    answer = _ask(interp, flags, env, pid)
    if answer is None or answer["hasten"] and answer["pth"]:
        return None
    ignoring = next((f"-{f}" for f in "IE" if f in flags), None)
    pythonpath = (env or {}).get("PYTHONPATH", "")
    replaced = site_dir not in pythonpath.split(os.pathsep)
    install = _install_hint(interp)
    if ignoring:
        hidden = f"{ignoring} makes it ignore PYTHONPATH, where hasten put itself"
        undo = f"run it without {ignoring}"
    elif replaced:
        hidden = f"the command replaced PYTHONPATH (now `{pythonpath}`), where hasten put itself"
        undo = "add to PYTHONPATH instead of replacing it"
    else:
        return None if answer["hasten"] else f"{who}: {interp} cannot import hasten; install it there ({install})"
    if not answer["hasten"]:
        return f"{who}: {interp} has no hasten installed, and {hidden}; install hasten there ({install}) or {undo}"
    return (f"{who}: the hasten installed in {interp} has no {PTH_NAME} (installed before hasten shipped one, or "
            f"not by pip), and {hidden}; reinstall hasten there ({install}) or {undo}")


def _ppid_session(pid: int) -> tuple[int, int] | None:
    fields = pid_stat(pid)
    try:
        return None if fields is None else (int(fields[PPID]), int(fields[SESSION]))
    except (ValueError, IndexError):
        return None


def _read_list(path: str) -> list[str] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return [s.decode(errors="replace") for s in data.split(b"\0") if s]


def _shown(argv: list[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 100 else text[:97] + "..."


def _interpreter(pid: int, argv: list[str], exe: str, env: dict | None) -> str:
    """The path the process was started by (a venv's ``bin/python``, which ``exe`` resolves past), else ``exe``."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return exe
    name = argv[0] if argv else ""
    if "/" in name:
        path = os.path.join(cwd, name)
    else:
        path = shutil.which(name, path=(env or os.environ).get("PATH", os.defpath)) if name else None
    if path and os.path.realpath(path) == os.path.realpath(exe):
        return path
    return exe


def _ask(interp: str, flags: set[str], env: dict | None, pid: int) -> dict | None:
    """The probe's answer from ``interp``, run as the silent process was (flags, environment, folder)."""
    run_env = {k: v for k, v in (env if env is not None else os.environ).items() if k != ENV_DIR}
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        out = subprocess.run([interp, *(f"-{f}" for f in sorted(flags & set("IEs"))), "-c", _PROBE], env=run_env,
                             cwd=cwd, capture_output=True, text=True, timeout=10)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _install_hint(interp: str) -> str:
    """How to install this hasten into ``interp``: the way it was installed here (editable from a checkout, ...)."""
    from importlib import metadata
    # Every copy: in a checkout, its hasten.egg-info comes first on the path and has no direct_url.json.
    texts = [d.read_text("direct_url.json") for d in metadata.distributions(name="hasten")]
    try:
        direct = json.loads(next((t for t in texts if t), "{}"))
    except ValueError:
        direct = {}
    url = urlparse(direct.get("url", ""))
    if url.scheme == "file":
        editable = "-e " if direct.get("dir_info", {}).get("editable") else ""
        return f"`{interp} -m pip install {editable}{unquote(url.path)}`"
    return f"`{interp} -m pip install hasten`"
