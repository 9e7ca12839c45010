"""Whether bf16 autocast can pay is asked of torch and the CPU, then timed with an interval (issue 43).

A CPU with avx512_bf16, where torch's own query says bf16 is supported and autocast made the
step x1.42-1.56 faster, was told "a bf16 matmul under autocast takes 1.5x the float32 one (no
native bf16)" by a single timing, and the next run said otherwise.
"""

import itertools
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from hasten.profile.inject import autocast_check


def _state():
    return SimpleNamespace(device="cpu", in_probe=False, bf16={})


def test_native_bf16_is_what_torchs_own_query_says_with_the_cpu_flags_beside_it():
    support = autocast_check.bf16_support("cpu")
    asked = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert support["native"] is asked
    assert f"torch.ops.mkldnn._is_mkldnn_bf16_supported() is {asked}" in support["facts"]
    flags = autocast_check._cpu_flags()
    if flags is not None and "avx512_bf16" in flags:
        assert "avx512_bf16" in support["facts"] and "no avx512_bf16" not in support["facts"]


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="oneDNN's ISA cap is read on Linux x86")
def test_onednn_capped_below_bf16_drops_the_probe_with_the_queried_facts_untimed():
    code = ("from types import SimpleNamespace\n"
            "from hasten.profile.inject import autocast_check\n"
            "st = SimpleNamespace(device='cpu', in_probe=False, bf16={})\n"
            "print(autocast_check.bf16_pays(st))\n"
            "print('matmul_ratio' in st.bf16)\n")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    why, timed = out.strip().splitlines()
    assert "no native bf16" in why and "_is_mkldnn_bf16_supported() is False" in why
    assert timed == "False"


def _timings(monkeypatch, pairs):
    """bf16_pays's timed products replaced: (bf16, float32) seconds of each pair, after one untimed each."""
    times = iter([1.0, 1.0] + [t for pair in pairs for t in pair])
    monkeypatch.setattr(autocast_check, "_timed", lambda st, fn: next(times))
    monkeypatch.setattr(autocast_check, "bf16_support", lambda device: {"native": True, "facts": "asked"})


def test_one_slow_reading_does_not_drop_the_probe(monkeypatch):
    # bf16 faster in six pairs of seven, one pair 1.5x slower (a spell of load): no drop
    _timings(monkeypatch, [(0.8, 1.0)] * 6 + [(1.5, 1.0)])
    st = _state()
    assert autocast_check.bf16_pays(st) is None
    lo, hi = st.bf16["matmul_interval"]
    assert lo <= 1.0 <= hi or hi < 1.0


def test_bf16_slower_beyond_its_interval_drops_the_probe_with_the_interval(monkeypatch):
    ratios = itertools.cycle([1.45, 1.5, 1.55])
    _timings(monkeypatch, [(next(ratios), 1.0) for _ in range(autocast_check.PAIRS)])
    why = autocast_check.bf16_pays(_state())
    assert why.startswith("a bf16 matmul takes 1.49x the float32 one") and "95% interval 1.4" in why
    assert f"{autocast_check.PAIRS} pairs; asked" in why
