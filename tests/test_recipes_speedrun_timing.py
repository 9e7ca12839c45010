"""The speedrun recipe measured from inside: what its clock holds, its FLOP count, its
schedule switches (EMA, Lookahead, the whitening-bias freeze), and its CUDA path exercised
on the CPU (the freeze under torch.compile, warm-ups, device settings)."""

import types

import pytest
import torch
from speedrun_helpers import SMALL, TINY_DATA
from speedrun_helpers import run_result as _result

import hasten.recipes.loop as loop
import hasten.recipes.speedrun as speedrun
import hasten.recipes.speedrun_train as speedrun_train
import hasten.timing
from hasten.data import ImageDataset
from hasten.data.normalize import channel_stats
from hasten.models.speedrun_net import SpeedrunNet
from hasten.nn.ema import airbench_decay_schedule, warmup_decay
from hasten.recipes.speedrun import (
    LADDER,
    SpeedrunConfig,
    flops_per_run,
    ladder_recipes,
    lr_factor,
    run,
    train_run,
)

# ----------------------------------------------------------------------------
# Timing scope, FLOP accounting and schedule switches, instrumented
# ----------------------------------------------------------------------------

# Fake seconds each instrumented piece costs: distinct powers of ten, so the timed
# total says exactly which pieces were inside the clock.
COPY, BUILD, LOADER, WHITEN, STEP, VALIDATE, FINAL = 1e10, 1e8, 1, 10, 100, 1e4, 1e6


class _Instrumented:
    """A fake clock for ``hasten.timing.Stopwatch`` and wrappers around the recipe's
    pieces that advance it and record what the run did."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        self.steps, self.evaluations, self.models, self.averages = [], [], [], []
        clock = types.SimpleNamespace(perf_counter=lambda: self.now, process_time=lambda: self.now)
        monkeypatch.setattr(hasten.timing, "time", clock)
        inst = self

        class Net(SpeedrunNet):
            def __init__(self, *args, **kwargs):
                inst.now += BUILD
                super().__init__(*args, **kwargs)
                inst.models.append(self)

        def loader(*args, **kwargs):
            self.now += LOADER
            return speedrun_loader(*args, **kwargs)

        def whiten(*args, **kwargs):
            self.now += WHITEN
            return speedrun_whiten(*args, **kwargs)

        def step(*args, **kwargs):
            self.now += STEP
            model = self.models[0]
            speedrun_step(*args, **kwargs)
            self.steps.append({"bias_trains": model.whiten.bias.requires_grad,
                               "bias": model.whiten.bias.detach().clone()})

        def evaluate(model, batches, level="none", **kwargs):
            self.now += VALIDATE if level == "none" else FINAL
            self.evaluations.append({"level": level, "state": {k: v.clone() for k, v in model.state_dict().items()},
                                     "is_live_model": model is self.models[0], "step": len(self.steps)})
            return speedrun_evaluate(model, batches, level, **kwargs)

        def recording(cls):
            class Recorded(cls):
                def __init__(self, model):
                    super().__init__(model)
                    self.calls = []
                    inst.averages.append(self)

                def update(self, model, decay):
                    self.calls.append((len(inst.steps), decay))
                    super().update(model, decay)
            return Recorded

        speedrun_loader, speedrun_whiten = speedrun_train.GpuLoader, speedrun_train.init_whitening_conv
        speedrun_step, speedrun_evaluate = loop.optimizer_step, speedrun_train.evaluate
        monkeypatch.setattr(loop, "optimizer_step", step)
        for name, value in [("SpeedrunNet", Net), ("GpuLoader", loader), ("init_whitening_conv", whiten),
                            ("evaluate", evaluate),
                            ("Lookahead", recording(speedrun_train.Lookahead)),
                            ("WeightAverage", recording(speedrun_train.WeightAverage))]:
            monkeypatch.setattr(speedrun_train, name, value)

    def data(self, dataset: ImageDataset):
        """``dataset`` whose copies to the device cost COPY each."""
        def counted(tensor):
            def to(*args, **kwargs):
                self.now += COPY
                return tensor.to(*args, **kwargs)
            return types.SimpleNamespace(to=to)
        return types.SimpleNamespace(train=types.SimpleNamespace(images=counted(dataset.train.images),
                                                                 labels=counted(dataset.train.labels)),
                                     test=types.SimpleNamespace(images=counted(dataset.test.images),
                                                                labels=counted(dataset.test.labels)))


# 96 training images, batch 32: 3 steps per epoch.
TIMED = SMALL.replace(epochs=3, tta="flip", averaging="none", whiten_bias_epochs=1)


def _run(monkeypatch, recipe, **kwargs):
    inst = _Instrumented(monkeypatch)
    result = train_run(recipe, inst.data(TINY_DATA), torch.device("cpu"),
                       mean_std=channel_stats(TINY_DATA.train.images), **kwargs)
    return inst, result


def test_timed_span_holds_set_up_steps_and_final_evaluation_only(monkeypatch):
    inst, result = _run(monkeypatch, TIMED)
    assert len(inst.steps) == 9
    # In: loader set-up, whitening set-up, 9 steps, the final TTA evaluation. Out: 4
    # copies to the device, building the network, one validation after the last epoch
    # (no per-epoch validation unless asked for: on a CPU each costs a fifth of an epoch).
    assert result.time_s == LOADER + WHITEN + 9 * STEP + FINAL
    assert result.cpu_time_s == result.time_s
    assert inst.now == 4 * COPY + BUILD + VALIDATE + result.time_s
    assert [e["time_s"] for e in result.epochs] == [LOADER + WHITEN + k * STEP for k in (3, 6)] + [result.time_s]
    assert [e["level"] for e in inst.evaluations] == ["none", "flip"]
    assert [e["val_accuracy"] is None for e in result.epochs] == [True, True, False]


def test_validation_every_epoch_when_asked_and_untimed(monkeypatch):
    inst, result = _run(monkeypatch, TIMED, validate_every_epoch=True)
    assert result.time_s == LOADER + WHITEN + 9 * STEP + FINAL
    assert inst.now == 4 * COPY + BUILD + 3 * VALIDATE + result.time_s
    assert [e["level"] for e in inst.evaluations] == ["none"] * 3 + ["flip"]


def test_warm_up_run_evaluates_nothing(monkeypatch):
    inst, result = _run(monkeypatch, TIMED, max_steps=2)
    assert len(inst.steps) == 2 and inst.evaluations == [] and result.epochs == []


def test_time_to_target_excludes_the_per_epoch_tta_evaluations(monkeypatch):
    inst, result = _run(monkeypatch, TIMED, target=0.0)
    assert result.epochs_to_target == 1 and result.time_to_target_s == LOADER + WHITEN + 3 * STEP
    assert result.time_s == LOADER + WHITEN + 9 * STEP + FINAL  # the untimed TTA evaluation added nothing
    assert [e["level"] for e in inst.evaluations] == ["none", "flip", "none", "none", "flip"]


def test_on_epoch_sees_every_record_once_and_targets_in_fractional_epochs(monkeypatch):
    seen = []
    inst, result = _run(monkeypatch, TIMED.replace(epochs=2.5), on_epoch=seen.append, target=1.01)
    assert len(inst.steps) == 8  # ceil(3 * 2.5)
    assert [r["epoch"] for r in seen] == [1, 2, 3] and seen == result.epochs
    assert seen[-1]["tta_accuracy"] == result.tta_accuracy and seen[-1]["time_s"] == result.time_s
    assert result.accuracy == seen[-1]["val_accuracy"] and result.epochs_to_target is None  # 1.01: unreachable
    _, reached = _run(monkeypatch, TIMED.replace(epochs=2.5), target=0.0)
    assert reached.epochs_to_target == 1
    # A target first reached in the last, partial epoch counts the epochs actually trained.
    _, short = _run(monkeypatch, TIMED.replace(epochs=0.5), target=0.0)
    assert short.epochs_to_target == 0.5 and short.time_to_target_s == LOADER + WHITEN + 2 * STEP


def test_warm_up_runs_but_is_not_timed(monkeypatch):
    inst = _Instrumented(monkeypatch)
    summary = run(SpeedrunConfig(recipe=TIMED, preset="tiny"), dataset=TINY_DATA)
    assert len(inst.steps) == 3 + 9  # the warm-up's 3 steps, then the run
    assert summary["runs"][0]["time_s"] == LOADER + WHITEN + 9 * STEP + FINAL
    assert summary["achieved_tflops"] == pytest.approx(summary["flops_per_run"] / summary["mean_time_s"] / 1e12)
    assert summary["flops_per_run"] == flops_per_run(TIMED, TINY_DATA)


def test_whitening_bias_trains_for_its_epochs_then_freezes(monkeypatch):
    inst, _ = _run(monkeypatch, TIMED.replace(whiten_bias_epochs=2))
    assert [s["bias_trains"] for s in inst.steps] == [True] * 6 + [False] * 3
    biases = [s["bias"] for s in inst.steps]
    assert not torch.equal(biases[0], biases[5])  # it did train
    assert all(torch.equal(b, biases[5]) for b in biases[6:])  # and then stayed put


def test_lookahead_decays_on_schedule_and_copies_back_at_the_end(monkeypatch):
    # 3.5 epochs of 3 steps: 11 steps, updates after steps 5 and 10, then the final copy-back
    # (11 is no multiple of 5: without the copy-back the live model would not hold the average).
    inst, _ = _run(monkeypatch, TIMED.replace(averaging="lookahead", epochs=3.5, ema_every=5))
    (look,) = inst.averages
    schedule = [0.95 ** 5 * (s / 11) ** 3 for s in range(12)]
    assert [s for s, _ in look.calls] == [5, 10, 11]
    assert [d for _, d in look.calls] == pytest.approx([schedule[5], schedule[10], 1.0])
    assert torch.allclose(airbench_decay_schedule(11), torch.tensor(schedule, dtype=torch.float32))
    final = inst.evaluations[-1]
    assert final["is_live_model"]
    for k, v in look.state.items():
        assert torch.equal(final["state"][k], v), k  # the evaluated weights are the average


def test_ema_is_evaluated_on_a_copy_and_leaves_the_live_model_alone(monkeypatch):
    inst, _ = _run(monkeypatch, TIMED.replace(averaging="ema", ema_every=2, ema_decay=0.9))
    (ema,) = inst.averages
    assert ema.calls == [(s, warmup_decay(0.9, s // 2 - 1)) for s in (2, 4, 6, 8)]
    assert [round(d, 4) for _, d in ema.calls] == [0.1, round(2 / 11, 4), 0.25, round(4 / 13, 4)]
    live = inst.models[0]
    for evaluation in inst.evaluations:
        assert not evaluation["is_live_model"]
    final = inst.evaluations[-1]
    differs = False
    for k, v in ema.state.items():
        assert torch.equal(final["state"][k], v), k
        differs |= not torch.equal(live.state_dict()[k], v)
    assert differs  # the live model kept its own (trained) weights


def _conv_flops(cin, cout, k, h, w):
    return 2 * cin * cout * k * k * h * w


def _hand_flops(widths, size, classes, whiten_frozen, bias_trains):
    """Per-example forward and training FLOPs of SpeedrunNet, layer by layer: a
    backward pass costs one forward for the input gradient (when something before
    the layer trains) and one for the weight gradient (when the weight trains)."""
    layers = []  # (forward flops, input gradient needed, weight gradient needed)
    h = size - 1  # the 2x2 whitening conv, no padding, 2 * 3 * 2 * 2 filters (+v and -v)
    layers.append((_conv_flops(3, 24, 2, h, h), False, not whiten_frozen))
    upstream_trains = bias_trains or not whiten_frozen
    cin = 24
    for cout in widths:
        layers.append((_conv_flops(cin, cout, 3, h, h), upstream_trains, True))
        h //= 2
        layers.append((_conv_flops(cout, cout, 3, h, h), True, True))
        upstream_trains, cin = True, cout
    layers.append((2 * widths[-1] * classes, True, True))
    forward = sum(f for f, _, _ in layers)
    train = forward + sum(f * needs_input + f * needs_weight for f, needs_input, needs_weight in layers)
    return forward, train


@pytest.mark.parametrize("whiten, tta, compile", [(True, "flip_translate", False), (False, "none", False),
                                                  (True, "flip", False), (True, "flip", True)])
def test_flops_per_run_matches_a_hand_count(whiten, tta, compile):
    # 96 images, batch 32: 3 steps per epoch, 2.5 epochs -> 8 steps, the bias trains in the first 3.
    # Compiled, its gradient (and the first group's input gradient) is computed in all 8.
    recipe = SMALL.replace(epochs=2.5, whiten=whiten, tta=tta, whiten_bias_epochs=1, compile=compile)
    forward, train_bias = _hand_flops((8, 8, 8), 16, 10, whiten, True)
    _, train_frozen = _hand_flops((8, 8, 8), 16, 10, whiten, compile)
    views = {"none": 1, "flip": 2, "flip_translate": 6}[tta]
    expected = 32 * (3 * train_bias + 5 * train_frozen) + views * 30 * forward
    assert flops_per_run(recipe, TINY_DATA) == expected



# ----------------------------------------------------------------------------
# The CUDA path on the CPU: the bias freeze under torch.compile, warm-ups, device
# settings, FLOPs as computed
# ----------------------------------------------------------------------------


def _bias_per_step(monkeypatch, recipe):
    """Train ``recipe`` on TINY_DATA; the whitening bias after every step."""
    biases = []
    real_step = loop.optimizer_step

    def step(loss, optimizer, scheduler, **hooks):
        real_step(loss, optimizer, scheduler, **hooks)
        biases.append(optimizer.param_groups[speedrun.WHITEN_BIAS_GROUP]["params"][0].detach().clone())

    monkeypatch.setattr(loop, "optimizer_step", step)
    train_run(recipe, TINY_DATA, torch.device("cpu"), mean_std=channel_stats(TINY_DATA.train.images))
    return biases


def test_compiled_runs_freeze_the_bias_by_its_lr_despite_momentum_and_weight_decay(monkeypatch):
    # compile=True keeps requires_grad on (a guarded input); torch.compile itself is
    # replaced by the identity so that only the freeze mechanism is under test.
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    biases = _bias_per_step(monkeypatch, TIMED.replace(whiten_bias_epochs=2, compile=True))
    assert len(biases) == 9
    assert all(not torch.equal(a, b) for a, b in zip(biases[:6], biases[1:6]))  # it trains every step
    # Frozen from step 7 on, although it still gets a gradient and has momentum and
    # weight decay: they are multiplied by its lr, which is 0.
    assert all(torch.equal(b, biases[5]) for b in biases[6:])


def test_freeze_lrs_follow_the_schedule_then_drop_to_zero():
    lambdas = speedrun.lr_lambdas(TIMED.replace(whiten_bias_epochs=2), total_steps=9, steps_per_epoch=3)
    assert len(lambdas) == 3
    for s in range(9):
        expected = lr_factor(s, 9, TIMED.warmup_frac)
        assert lambdas[0](s) == lambdas[1](s) == expected
        assert lambdas[2](s) == (expected if s < 6 else 0.0)


def test_compiled_run_compiles_once_across_the_bias_freeze(monkeypatch):
    """With a counting backend: the freeze at epoch 1 must not recompile (toggling
    requires_grad would: it is a guarded input)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: real_compile(model, backend=counter))
    biases = _bias_per_step(monkeypatch, TIMED.replace(whiten_bias_epochs=1, compile=True))
    assert counter.frame_count == 1
    assert not torch.equal(biases[0], biases[2]) and all(torch.equal(b, biases[3]) for b in biases[4:])
    torch._dynamo.reset()


def test_no_timed_run_compiles_after_the_warm_up(monkeypatch):
    """The warm-up (30 steps) ends before the freeze (step 33): the timed runs still
    find every graph they need compiled."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    real_compile, real_train_run = torch.compile, speedrun.train_run
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: real_compile(model, backend=counter))
    compiles = []

    def train_run_counted(*args, max_steps=None, **kwargs):
        before = counter.frame_count
        result = real_train_run(*args, max_steps=max_steps, **kwargs)
        compiles.append((max_steps, counter.frame_count - before))
        return result

    monkeypatch.setattr(speedrun, "train_run", train_run_counted)
    recipe = SMALL.replace(epochs=12, whiten_bias_epochs=11, compile=True, tta="none")
    run(SpeedrunConfig(recipe=recipe, preset="tiny", runs=2), dataset=TINY_DATA)
    assert compiles == [(30, 1), (None, 0), (None, 0)]
    torch._dynamo.reset()


@pytest.fixture
def dynamo_config():
    """warm_up raises Dynamo's recompile limit for compiled ladders: restore it after the test.

    Saved and set back by value, not with monkeypatch: pytest 9.2's monkeypatch undoes a
    module attribute that is not in the module's ``__dict__`` by deleting it, and
    deleting an entry of torch's config module hides it from every later reader."""
    config = torch._dynamo.config
    saved = config.recompile_limit
    yield config
    config.recompile_limit = saved


def test_warm_up_covers_every_distinct_rung_when_compiling_or_on_cuda(monkeypatch, dynamo_config):
    config = dynamo_config
    calls = []
    monkeypatch.setattr(speedrun, "train_run", lambda recipe, *a, max_steps=None, **k: calls.append((recipe, max_steps)))
    rungs = [r for _, r in ladder_recipes(SMALL)]
    speedrun.warm_up(rungs + rungs[:2], TINY_DATA, torch.device("cuda"), None)
    assert calls == [(r, 30) for r in rungs]  # each distinct recipe once, 30 steps
    calls.clear()
    speedrun.warm_up(rungs, TINY_DATA, torch.device("cpu"), None)
    assert calls == [(rungs[0], 3)]  # eager on the CPU: first-call overheads only
    calls.clear()
    compiled = [r.replace(compile=True) for r in rungs]
    speedrun.warm_up(compiled, TINY_DATA, torch.device("cpu"), None)
    assert calls == [(r, 30) for r in compiled]
    assert config.recompile_limit >= len(compiled)  # every rung's graph stays cached


@pytest.mark.parametrize("ablate", [False, True])
def test_run_sets_up_the_device_then_warms_up_every_timed_recipe_first(monkeypatch, ablate, dynamo_config):
    events = []
    monkeypatch.setattr(speedrun, "configure_device", lambda device: events.append(("configure", None)))

    def fake_train_run(recipe, *args, max_steps=None, **kwargs):
        events.append(("warm-up" if max_steps else "timed", recipe))
        return _result(0.5, 1.0)

    monkeypatch.setattr(speedrun, "train_run", fake_train_run)
    monkeypatch.setattr(speedrun, "flops_per_run", lambda *a: 1)
    recipe = SMALL.replace(compile=True)
    run(SpeedrunConfig(recipe=recipe, preset="tiny", ablate=ablate, target=0.5), dataset=TINY_DATA)
    assert events[0] == ("configure", None)
    timed = [r for kind, r in events if kind == "timed"]
    first_timed = next(i for i, (kind, _) in enumerate(events) if kind == "timed")
    warmed = [r for kind, r in events[:first_timed] if kind == "warm-up"]
    assert set(timed) <= set(warmed) and len(warmed) == len(set(timed)) == (len(LADDER) if ablate else 1)
    assert all(kind == "timed" for kind, _ in events[first_timed:])


def test_configure_device_turns_on_cudnn_autotuning_on_cuda_only(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    speedrun.configure_device(torch.device("cpu"))
    assert torch.backends.cudnn.benchmark is False
    speedrun.configure_device(torch.device("cuda"))
    assert torch.backends.cudnn.benchmark is True


def test_ema_evaluation_network_is_built_outside_the_timed_span(monkeypatch):
    inst, result = _run(monkeypatch, TIMED.replace(averaging="ema", ema_every=2))
    assert len(inst.models) == 2  # the live network and the EMA's evaluation network, built once
    assert result.time_s == LOADER + WHITEN + 9 * STEP + FINAL
    assert inst.now == 4 * COPY + 2 * BUILD + VALIDATE + result.time_s


@pytest.mark.parametrize("compile", [False, True])
def test_flops_per_run_is_what_a_run_computes(monkeypatch, compile):
    """A FLOP counter around a whole run: training, the whitening set-up, the
    per-epoch validations and the final evaluation. Less the last three (measured
    separately), that is flops_per_run: eager runs skip the first group's input
    gradient once the bias freezes, compiled runs do not."""
    from torch.utils.flop_counter import FlopCounterMode

    from hasten.nn.whitening import whitening_filters

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    recipe = TIMED.replace(whiten_bias_epochs=1, tta="none", compile=compile)
    with FlopCounterMode(display=False) as total:
        result = train_run(recipe, TINY_DATA, torch.device("cpu"), mean_std=channel_stats(TINY_DATA.train.images))
    with FlopCounterMode(display=False) as whitening:
        whitening_filters(TINY_DATA.train.images[:5000].float(), 2)
    model = SpeedrunNet(recipe.net).eval()
    with FlopCounterMode(display=False) as forward, torch.no_grad():
        model(torch.zeros(len(TINY_DATA.test.labels), 3, 16, 16))
    validations = sum(e["val_accuracy"] is not None for e in result.epochs) * forward.get_total_flops()
    assert total.get_total_flops() - whitening.get_total_flops() - validations == flops_per_run(recipe, TINY_DATA)
