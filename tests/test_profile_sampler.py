"""Where the stack sampler files a sample outside hasten's timed compute, and which line it names (issue 43).

"16% of the step in ``loss = nn.functional.cross_entropy(model(x), y)`` (neither data, compute nor
communication)": a loss computed with a plain function, a module without parameters, an
optimizer's step are compute, and the line named is the innermost of the user's own frames
(a helper in a second file), never torch's, Lightning's or an installed package's.
"""

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from hasten.profile.inject import sampler, user_code
from hasten.profile.launcher import ProfileConfig, run_instrumented

SCRIPTS = Path(__file__).parent / "profile_scripts"
sys.path.insert(0, str(SCRIPTS))
import _loss_helper  # noqa: E402


def _state():
    return SimpleNamespace(outside_counts={}, line_samples={}, line_info={}, batch_lines={}, batch_fn_code=None)


def _sampled_from(where: str, st):
    """A function in a file of ``where``'s (an installed package's, torch's) that samples the stack it runs in."""
    ns = {}
    source = "import sys\ndef probe(attribute, st):\n    return lambda: attribute(st, sys._getframe())\n"
    exec(compile(source, where, "exec"), ns)
    return ns["probe"](sampler.attribute, st)


def test_a_sample_in_a_module_without_parameters_is_compute_named_by_the_helpers_line():
    st = _state()
    sharpen = _loss_helper.Sharpen()
    sharpen.probe = _sampled_from("/venv/lib/site-packages/somepkg/probe.py", st)
    _loss_helper.loss_of(nn.Linear(4, 8), sharpen, torch.randn(2, 4), torch.tensor([1, 2]))
    assert st.outside_counts == {"other": 1, "compute": 1}  # a subset of "other": the data split stays as it was
    ((at, n),) = st.line_samples["compute"].items()
    assert at.startswith("_loss_helper.py:") and "other" not in st.line_samples
    assert st.line_info[at]["function"] == "forward" and "self.probe()" in st.line_info[at]["code"]


def test_a_sample_in_a_plain_loss_function_or_an_optimizer_step_is_compute():
    st = _state()

    class Probed(torch.Tensor):  # torch's functional code hands a tensor subclass to __torch_function__
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is F.cross_entropy:
                _sampled_from("/venv/lib/site-packages/somepkg/probe.py", st)()
            return super().__torch_function__(func, types, args, kwargs or {})

    F.cross_entropy(torch.randn(2, 3).as_subclass(Probed), torch.tensor([0, 1]))
    assert st.outside_counts.get("compute") == 1
    assert all(at.startswith("test_profile_sampler.py:") for at in st.line_samples["compute"])


def test_a_sample_in_a_sleep_or_a_scheduler_step_is_the_rest_of_the_step():
    st = _state()
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: (_sampled_from("/x/lib/site-packages/p.py", st)(), 1)[1])
    sched.step()
    _sampled_from("/x/lib/site-packages/p.py", st)()
    assert "compute" not in st.outside_counts and st.outside_counts["other"] >= 2


def test_the_users_frames_are_not_torchs_lightnings_or_an_installed_packages():
    for path in ("/venv/lib/python3.12/site-packages/lightning/pytorch/loops/fit_loop.py",
                 "/src/lightning/pytorch/trainer/trainer.py", "/usr/lib/python3/dist-packages/x/y.py",
                 "/venv/lib/python3.12/site-packages/torch/nn/functional.py"):
        assert not user_code.is_users(path), path
    assert user_code.is_users(str(SCRIPTS / "_loss_helper.py"))


def test_a_profiled_loop_never_names_its_loss_helper_as_the_rest_and_names_its_sleep():
    config = ProfileConfig((sys.executable, str(SCRIPTS / "helper_loss.py"), "--classes", "8192", "--pause", "0.01"),
                           warmup=1, steps=30, probe_steps=2, capture=True, timeout_s=600, decide_s=0, skip_probes=("replay", "loader"))
    (rank,) = run_instrumented(config, log=lambda m: None).ranks
    lines = rank["outside"]["lines"]
    assert not [x for x in lines.get("other", []) if x["at"].startswith("_loss_helper.py:")]
    assert [x for x in lines.get("compute", []) if x["at"].startswith("_loss_helper.py:")]
    assert any("time.sleep" in x["code"] for x in lines.get("other", []))


def test_a_hook_calling_into_hastens_library_is_hastens_time_not_a_line_of_the_loop():
    # `14% of the step in cpu_time.py:149 ...`: a step hook reading /proc through hasten/cpu_time.py
    st = _state()
    ns = {}
    exec(compile("import sys\ndef read(attribute, st):\n    attribute(st, sys._getframe())\n",
                 "/src/hasten/cpu_time.py", "exec"), ns)
    exec(compile("def hook(read, attribute, st):\n    read(attribute, st)\n", "/src/hasten/profile/inject/steps.py",
                 "exec"), ns)
    ns["hook"](ns["read"], sampler.attribute, st)
    assert st.outside_counts == {"hasten": 1} and not st.line_samples
    # hasten's library called from the loop itself (an echo wrapper) is the loop's time, named by its line
    ns["read"](sampler.attribute, st)
    assert st.outside_counts["other"] == 1 and st.line_samples["other"]
