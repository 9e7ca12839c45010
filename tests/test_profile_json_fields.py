"""docs/profile.md's JSON tables against what `hasten profile --json` writes (issue 43).

The field lists had drifted from the output (verification's fields, ``cost.verify_runs``, the
contention's fields, ``ended_early``): every field written must be documented, and every field
documented must be written (those marked *(workers)* or *(--verify)* in runs of that kind).
"""

import json
import re
import sys
from pathlib import Path

import pytest

from hasten.cli import main
from hasten.profile.report import results_json
from hasten.profile.verify import verify
from hasten.profile.launcher import run_instrumented
from test_profile_verify import SLOW, _analysis, _config, _null_fix

DOC = Path(__file__).parent.parent / "docs" / "profile.md"
SCRIPTS = Path(__file__).parent / "profile_scripts"
TABLES = {"Top level:": "", "In `cpu`:": "cpu", "In `cost`:": "cost", "In each of `recommendations`:": "recommendation",
          "In a recommendation's `verification`:": "verification"}


def documented() -> dict[str, dict[str, str]]:
    """Each JSON table of docs/profile.md: its fields, each with its condition ('', 'workers' or '--verify')."""
    text = DOC.read_text()
    section = text[text.index("\n## JSON\n"):]
    tables: dict[str, dict[str, str]] = {}
    current = None
    for line in section.splitlines():
        if line in TABLES:
            current = tables.setdefault(TABLES[line], {})
        elif current is not None and line.startswith("| `"):
            names, meaning = line.split("|")[1:3]
            cond = re.match(r"\s*\*\((workers|--verify)\)\*", meaning)
            for name in re.findall(r"`([^`]+)`", names):
                current[name] = cond.group(1) if cond else ""
        elif current is not None and line and not line.startswith("|"):
            current = None
    return tables


def test_the_docs_have_every_table():
    assert set(documented()) == set(TABLES.values())


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A real `hasten profile --json` run with DataLoader workers, and a real verification's fields."""
    tmp = tmp_path_factory.mktemp("json")
    out = tmp / "p.json"
    code = main(["profile", "--warmup", "2", "--steps", "8", "--probe-steps", "4", "--decide-within", "0",
                 "--quiet", "--json", str(out), "--", sys.executable, str(SCRIPTS / "input_bound.py"),
                 "--workers", "2", "--item-work", "0.001", "--batch", "8"])
    assert code == 0
    run = json.loads(out.read_text())
    # a verification, as --verify writes it: one run switching a fix that changes nothing (see test_profile_verify)
    a = _analysis([], [_null_fix("comm=bf16")])
    verify(_config("autocast_sleep.py", "--virtual-clock"), a, log=lambda m: None, run_instrumented=run_instrumented)
    verified = results_json(a, ["python", "x.py"], {})
    return run, verified


@SLOW
def test_every_field_written_is_documented_and_every_field_documented_is_written(written):
    run, verified = written
    docs = documented()
    (rec,) = verified["rejected"]
    seen = {"": set(run), "cpu": set(run["cpu"]), "cost": set(run["cost"]) | set(verified["cost"]),
            "recommendation": set().union(*(r.keys() for r in run["recommendations"] + verified["recommendations"])),
            "verification": set(rec["verification"])}
    assert run["num_workers"] == 2 and run["recommendations"]  # the run the conditional fields need
    for table, fields in docs.items():
        undocumented = seen[table] - set(fields)
        assert not undocumented, f"{table or 'top level'}: written but not in docs/profile.md: {sorted(undocumented)}"
        missing = set(fields) - seen[table]
        assert not missing, f"{table or 'top level'}: in docs/profile.md but not written: {sorted(missing)}"
    assert set(verified["cost"]) >= {k for k, c in docs["cost"].items() if c == "--verify"}
    assert not {k for k, c in docs["cost"].items() if c == "--verify"} & set(run["cost"])  # only with --verify
