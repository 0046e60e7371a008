"""Residency planner (digenrl/systems/residency.py; a unit test, so here rather than in tests/systems, which
runs whole runs): the exact transition sequences of the seed PR (docs/references.md [001]) per policy.

The loop driver below mirrors the PR's synchronous ``train()``: an evaluation at step 0 when evaluation is
on, then per rollout generate -> score -> (optimizer step at the end of an accumulate window) -> evaluate
if due -> save if due. Sequences are written the way the PR's logs print them.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter

import pytest
import torch
from torch import nn

from digenrl.systems.residency import (
    ROLES,
    ResidencyPlanner,
    ResidencyPolicy,
    TransitionRecord,
    chain_transitions,
    module_transitions,
    optimizer_transitions,
)

ALL_PARKED = ResidencyPolicy(train_resident=False, rollout_resident=False, reward_resident=False)
SIX = "train offload, rollout onload, rollout offload, reward onload, reward offload, train onload"


def seq(text: str) -> list[tuple[str, str]]:
    """'train offload, rollout onload' -> [('train', 'offload'), ('rollout', 'onload')]."""
    out = []
    for item in text.split(","):
        role, kind = item.split()
        out.append((role, kind))
    return out


def make(policy=None, *, tracked=ROLES, initial=None):
    """A planner whose transitions record their calls, plus the call list and the log lines."""
    calls: list[tuple[str, str]] = []
    lines: list[str] = []

    def pair(role):
        return (lambda: calls.append((role, "onload")), lambda: calls.append((role, "offload")))

    planner = ResidencyPlanner(
        policy if policy is not None else ResidencyPolicy(),
        tracked=set(tracked),
        transitions={role: pair(role) for role in tracked},
        log=lines.append,
        initial=initial,
    )
    return planner, calls, lines


def run_loop(planner, *, rollouts, accumulate=1, eval_interval=0, save_interval=0, eval_chunks=1):
    """The PR's loop; returns {segment label: transitions issued in it}."""
    segments: dict[str, list[tuple[str, str]]] = {}

    def segment(label, body):
        start = len(planner.history)
        body()
        segments[label] = planner.history[start:]

    def evaluate():
        with planner.evaluation() as ev:
            for _ in range(eval_chunks):
                with ev.generation():
                    pass
                with ev.scoring():
                    pass

    if eval_interval:
        segment("eval 0", evaluate)
    for r in range(1, rollouts + 1):

        def rollout(r=r):
            with planner.generation():
                assert planner.active == "rollout"
            with planner.scoring():
                assert planner.active == "reward"
            if r % accumulate == 0:
                planner.before_optimizer_step()
                assert planner.on_device("train") if "train" in planner.tracked else True

        segment(f"rollout {r}", rollout)

        def after(r=r):
            if eval_interval and r % eval_interval == 0:
                evaluate()
            due = bool(save_interval) and (r % save_interval == 0 or r == rollouts)
            planner.before_save(due)
            if due and "train" in planner.tracked:
                assert planner.on_device("train"), "trainer must be resident for the save"

        segment(f"after {r}", after)
    return segments


def assert_train_onload_follows_reward_offload(history):
    """The PR's peak invariant: the trainer never returns beside a resident (non-resident-policy) reward."""
    onloads = [i for i, t in enumerate(history) if t == ("train", "onload")]
    assert onloads, "vacuous: no train onload in this arm"
    for i in onloads:
        assert i > 0 and history[i - 1] == ("reward", "offload"), (i, history[max(0, i - 3) : i + 1])


# ------------------------------------------------------------------ policies, two rollouts each


def test_defaults_move_only_the_rollout():
    planner, calls, lines = make()
    run_loop(planner, rollouts=2)
    expected = seq("rollout onload, rollout offload") * 2
    assert planner.history == expected
    assert calls == expected  # the planner reaches the engines only through the pair
    assert lines == ["residency: rollout onload", "residency: rollout offload"] * 2
    assert planner.state() == {"train": True, "rollout": False, "reward": True}


def test_resident_rollout_is_woken_once_and_never_slept():
    planner, _, _ = make(ResidencyPolicy(rollout_resident=True))
    run_loop(planner, rollouts=3)
    assert planner.history == [("rollout", "onload")]
    assert planner.state() == {"train": True, "rollout": True, "reward": True}


def test_parked_trainer_round_trips_once_per_rollout():
    planner, _, _ = make(ResidencyPolicy(train_resident=False))
    run_loop(planner, rollouts=2)
    assert planner.history == seq("train offload, rollout onload, rollout offload, train onload") * 2


def test_all_parked_six_transition_cycle_repeats_identically():
    planner, calls, _ = make(ALL_PARKED)
    segments = run_loop(planner, rollouts=2)
    assert segments["rollout 1"] == seq(SIX)
    assert segments["rollout 2"] == seq(SIX)
    assert segments["after 1"] == segments["after 2"] == []
    assert planner.history == calls == seq(SIX) * 2
    assert_train_onload_follows_reward_offload(planner.history)


def test_all_parked_with_reward_built_on_device_parks_it_with_the_trainer():
    # The PR's rebased hardware log: the scorer was loaded onto the GPU, so the first rollout parks both.
    planner, _, _ = make(ALL_PARKED, initial={"reward": True})
    segments = run_loop(planner, rollouts=2)
    assert segments["rollout 1"] == seq(
        "train offload, reward offload, " + SIX.removeprefix("train offload, ")
    )
    assert segments["rollout 2"] == seq(SIX)


def test_parked_trainer_that_is_not_tracked_is_rejected():
    with pytest.raises(ValueError, match=r"residency\.train_resident"):
        ResidencyPlanner(ResidencyPolicy(train_resident=False), tracked={"rollout", "reward"})


def test_untracked_resident_trainer_never_moves():
    planner, _, _ = make(ResidencyPolicy(reward_resident=False), tracked={"rollout", "reward"})
    run_loop(planner, rollouts=2, save_interval=1)
    assert planner.history == seq("rollout onload, rollout offload, reward onload, reward offload") * 2
    assert all(role != "train" for role, _ in planner.history)


def test_reward_on_its_own_slab_never_moves():
    planner, calls, _ = make(ResidencyPolicy(reward_resident=False), tracked={"train", "rollout"})
    run_loop(planner, rollouts=2)
    assert planner.history == calls == seq("rollout onload, rollout offload") * 2


def test_untracked_active_role_still_parks_the_others():
    # A trainer on its own slab: entering it must still park a non-resident reward left on the device.
    planner, _, _ = make(ResidencyPolicy(reward_resident=False), tracked={"rollout", "reward"})
    planner.enter("reward")
    assert planner.history == seq("reward onload")
    planner.before_optimizer_step()  # train is untracked
    assert planner.history == seq("reward onload, reward offload")
    assert planner.state() == {"rollout": False, "reward": False}


# ------------------------------------------------------------------ accumulate windows, eval, checkpoint


def test_accumulate_window_returns_the_parked_trainer_once_per_window():
    planner, _, _ = make(ALL_PARKED)
    run_loop(planner, rollouts=4, accumulate=2)
    window = seq(
        "train offload, rollout onload, rollout offload, reward onload, reward offload, "
        "rollout onload, rollout offload, reward onload, reward offload, train onload"
    )
    assert planner.history == window * 2

    planner, _, _ = make(ResidencyPolicy(train_resident=False))
    run_loop(planner, rollouts=4, accumulate=2)
    window = seq(
        "train offload, rollout onload, rollout offload, rollout onload, rollout offload, train onload"
    )
    assert planner.history == window * 2


def test_eval_then_checkpoint_brings_the_trainer_back_before_the_save():
    # The PR's eval + checkpoint arm: eval_interval=2, save_interval=2, two rollouts, scorer built on device.
    planner, _, _ = make(ALL_PARKED, initial={"reward": True})
    segments = run_loop(planner, rollouts=2, eval_interval=2, save_interval=2)
    assert segments["eval 0"] == seq(
        "train offload, reward offload, rollout onload, rollout offload, reward onload, reward offload"
    )
    assert segments["rollout 1"] == seq(
        "rollout onload, rollout offload, reward onload, reward offload, train onload"
    )
    assert segments["after 1"] == []
    assert segments["rollout 2"] == seq(SIX)
    assert segments["after 2"] == seq(SIX)  # EVAL step 2, then the train onload before the save
    assert planner.history[-1] == ("train", "onload") and planner.on_device("train")
    assert_train_onload_follows_reward_offload(planner.history)


def test_multi_chunk_eval_window_without_save_pays_no_onload():
    # The PR's multi-chunk arm: eval_interval=1, 3 chunks per eval, save_interval=2, two rollouts.
    planner, _, _ = make(ALL_PARKED, initial={"reward": True})
    segments = run_loop(planner, rollouts=2, eval_interval=1, eval_chunks=3, save_interval=2)
    history = planner.history
    assert len(history) == 51
    chunk = seq("rollout onload, rollout offload, reward onload, reward offload")
    assert segments["after 1"] == seq("train offload") + chunk * 3  # evaluates, no save due: no onload
    assert segments["after 2"] == seq("train offload") + chunk * 3 + seq("train onload")  # eval, then save
    assert segments["rollout 2"] == seq(SIX.removeprefix("train offload, "))  # inherits the parked trainer
    counts = Counter(history)
    assert counts[("train", "onload")] == 3  # 2 optimizer steps + 1 save
    assert counts[("rollout", "onload")] == counts[("rollout", "offload")] == 11
    assert counts[("reward", "onload")] == 11 and counts[("reward", "offload")] == 12
    assert_train_onload_follows_reward_offload(history)


def test_long_accumulate_arm_transition_counts():
    # The PR's long arm: 10 rollouts, accumulate 2, eval/save every 4 (+ final save), 2 chunks per eval.
    planner, _, _ = make(ALL_PARKED, initial={"reward": True})
    run_loop(planner, rollouts=10, accumulate=2, eval_interval=4, save_interval=4, eval_chunks=2)
    counts = Counter(planner.history)
    assert (counts[("rollout", "onload")], counts[("rollout", "offload")]) == (16, 16)
    assert (counts[("reward", "onload")], counts[("reward", "offload")]) == (16, 17)
    assert (counts[("train", "onload")], counts[("train", "offload")]) == (7, 7)
    assert_train_onload_follows_reward_offload(planner.history)


def test_eval_without_resync_keeps_the_rollout_awake_across_chunks():
    planner, _, _ = make(ALL_PARKED)
    with planner.evaluation(keep_rollout_awake=True, sleep_after=False) as ev:
        for _ in range(2):
            with ev.generation():
                pass
            with ev.scoring():
                assert planner.on_device("rollout") and planner.on_device("reward")
    assert planner.history == seq(
        "train offload, rollout onload, reward onload, reward offload, reward onload, reward offload"
    )
    planner.before_save(True)  # the awake non-resident engine is parked before the trainer returns
    assert planner.history[-2:] == seq("rollout offload, train onload")

    planner, _, _ = make(ALL_PARKED)
    with planner.evaluation(keep_rollout_awake=True) as ev:
        with ev.generation():
            pass
        with ev.scoring():
            pass
    assert planner.history == seq(
        "train offload, rollout onload, reward onload, reward offload, rollout offload"
    )


@pytest.mark.parametrize("read", ["before_weight_read", "before_optimizer_step", "before_save"])
def test_trainer_read_parks_a_left_over_reward_first(read):
    # The PR's OOM shape: a bare onload of the trainer beside a scorer still on the device.
    planner, _, _ = make(ALL_PARKED, initial={"train": False, "reward": True})
    getattr(planner, read)(*([True] if read == "before_save" else []))
    assert planner.history == seq("reward offload, train onload")
    assert planner.active == "train"


def test_before_save_not_due_moves_nothing():
    planner, _, _ = make(ALL_PARKED)
    with planner.generation():
        pass
    before = planner.history
    assert planner.before_save(False) is False
    assert planner.history == before and not planner.on_device("train")


# ------------------------------------------------------------------ config and input validation


def test_policy_from_config():
    assert ResidencyPolicy.from_config(None) == ResidencyPolicy(True, False, True)
    assert ResidencyPolicy.from_config({}) == ResidencyPolicy()
    flags = [bool(b) for b in torch.randint(0, 2, (3,))]
    cfg = dict(zip(("train_resident", "rollout_resident", "reward_resident"), flags, strict=True))
    policy = ResidencyPolicy.from_config(cfg)
    assert [policy.is_resident(r) for r in ROLES] == flags
    with pytest.raises(ValueError, match=r"residency\.offload_train_during_reward.*allowed: train_resident"):
        ResidencyPolicy.from_config({"train_resident": True, "offload_train_during_reward": True})
    with pytest.raises(ValueError, match=r"residency\.reward_resident"):
        ResidencyPolicy.from_config({"reward_resident": "false"})
    with pytest.raises(ValueError, match="role"):
        ResidencyPolicy().is_resident("critic")


def test_require_resident_names_the_key():
    ResidencyPolicy().require_resident("reward", system="colocated-overlap", reason="scores in background")
    with pytest.raises(ValueError, match=r"residency\.reward_resident=false.*colocated-overlap"):
        ResidencyPolicy(reward_resident=False).require_resident(
            "reward", system="colocated-overlap", reason="scores in background"
        )


def test_constructor_rejects_bad_input():
    noop = (lambda: None, lambda: None)
    with pytest.raises(ValueError, match="critic"):
        ResidencyPlanner(tracked={"train", "critic"})
    with pytest.raises(ValueError, match=r"missing for tracked role.*reward"):
        ResidencyPlanner(transitions={"train": noop, "rollout": noop})
    with pytest.raises(ValueError, match=r"untracked role.*reward"):
        ResidencyPlanner(
            tracked={"train", "rollout"}, transitions={"train": noop, "rollout": noop, "reward": noop}
        )
    with pytest.raises(ValueError, match=r"transitions\['train'\]"):
        ResidencyPlanner(transitions={"train": (noop[0],), "rollout": noop, "reward": noop})
    with pytest.raises(ValueError, match="initial"):
        ResidencyPlanner(tracked={"train", "rollout"}, initial={"reward": True})
    with pytest.raises(ValueError, match="policy"):
        ResidencyPlanner({"train_resident": True})


def test_runtime_misuse_is_reported():
    planner = ResidencyPlanner(tracked={"train", "rollout"})
    with pytest.raises(ValueError, match="not tracked"):
        planner.on_device("reward")
    planner.enter("rollout")
    with pytest.raises(ValueError, match="active role is 'rollout'"):
        planner.leave("reward")
    with pytest.raises(ValueError, match="keep"):
        planner.enter("train", keep={"reward"})
    with pytest.raises(ValueError, match="due"):
        planner.before_save(1)


def test_failed_transition_leaves_the_table_unchanged():
    attempts = itertools.count()

    def flaky_onload():
        if next(attempts) == 0:
            raise RuntimeError("engine refused to wake")

    planner = ResidencyPlanner(tracked={"rollout"}, transitions={"rollout": (flaky_onload, lambda: None)})
    with pytest.raises(RuntimeError, match="refused"):
        planner.enter("rollout")
    assert planner.history == [] and planner.state() == {"rollout": False}
    planner.enter("rollout")
    assert planner.history == [("rollout", "onload")] and planner.on_device("rollout")


def test_records_carry_bytes_and_seconds():
    ticks = iter(float(t) for t in range(100))
    sizes = {"train": int(torch.randint(1, 10_000, ()).item()), "rollout": int(torch.randint(1, 10_000, ()))}
    planner = ResidencyPlanner(
        ResidencyPolicy(train_resident=False),
        tracked={"train", "rollout"},
        transitions={r: (lambda r=r: sizes[r], lambda r=r: sizes[r]) for r in ("train", "rollout")},
        clock=lambda: next(ticks),
    )
    with planner.generation():
        pass
    planner.before_optimizer_step()
    assert planner.records == [
        TransitionRecord("train", "offload", sizes["train"], 1.0),
        TransitionRecord("rollout", "onload", sizes["rollout"], 1.0),
        TransitionRecord("rollout", "offload", sizes["rollout"], 1.0),
        TransitionRecord("train", "onload", sizes["train"], 1.0),
    ]
    bookkeeping = ResidencyPlanner(tracked={"rollout"})
    with bookkeeping.generation():
        pass
    assert [r.bytes for r in bookkeeping.records] == [None, None]
    assert bookkeeping.history == seq("rollout onload, rollout offload")


# ------------------------------------------------------------------ real transitions (CPU stand-in device)


def _tiny_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model(torch.randn(6, 5)).square().sum().backward()  # gradients pending, running stats updated
    return model


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    params = list(model.parameters())
    return [*params, *(p.grad for p in params), *model.buffers()]


def test_module_transitions_move_and_restore_bit_identical():
    model = _tiny_model()
    snapshot = [t.detach().clone() for t in _tensors(model)]
    resident_ptrs = {t.data_ptr() for t in _tensors(model)}
    expected_bytes = sum(t.numel() * t.element_size() for t in snapshot)
    param_ids = [id(p) for p in model.parameters()]
    onload, offload = module_transitions(model, "cpu")

    assert offload() == expected_bytes
    parked_ptrs = {t.data_ptr() for t in _tensors(model)}
    assert parked_ptrs.isdisjoint(resident_ptrs)  # nothing references the device copies any more
    for t, ref in zip(_tensors(model), snapshot, strict=True):
        assert torch.equal(t, ref)
    with pytest.raises(RuntimeError, match="already parked"):
        offload()

    assert onload() == expected_bytes
    assert {t.data_ptr() for t in _tensors(model)}.isdisjoint(parked_ptrs)  # fresh device storage
    assert [id(p) for p in model.parameters()] == param_ids  # same Parameter objects: optimizers stay bound
    for t, ref in zip(_tensors(model), snapshot, strict=True):
        assert t.dtype == ref.dtype and torch.equal(t, ref)
    with pytest.raises(RuntimeError, match="not parked"):
        onload()
    # A second cycle reuses the host buffers (same parked pointers).
    offload()
    assert {t.data_ptr() for t in _tensors(model)} == parked_ptrs
    onload()


def test_optimizer_transitions_keep_training_exact():
    model = _tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt.step()
    ref_model = copy.deepcopy(model)
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # step tensors are not copied

    state_bytes = sum(
        v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)
    )
    train = chain_transitions(module_transitions(model, "cpu"), optimizer_transitions(opt, "cpu"))
    model_bytes = sum(t.numel() * t.element_size() for t in _tensors(model))
    assert train.offload() == model_bytes + state_bytes
    assert train.onload() == model_bytes + state_bytes

    x = torch.randn(6, 5)
    for m, o in ((model, opt), (ref_model, ref_opt)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_chain_transitions_order_and_unknown_bytes():
    order: list[str] = []
    a = (lambda: order.append("a on") or 3, lambda: order.append("a off") or 3)
    b = (lambda: order.append("b on") or 4, lambda: order.append("b off") or 4)
    chained = chain_transitions(a, b)
    assert chained.onload() == 7 and chained.offload() == 7
    assert order == ["a on", "b on", "b off", "a off"]
    unknown = chain_transitions(a, (lambda: None, lambda: None))
    assert unknown.onload() is None
    with pytest.raises(ValueError, match="pair"):
        chain_transitions()


def test_planner_drives_real_modules():
    trainer, generator = _tiny_model(), _tiny_model()
    train_snapshot = [t.detach().clone() for t in _tensors(trainer)]
    rollout_pair = module_transitions(generator, "cpu")
    rollout_pair.offload()  # the engine is built asleep, as the planner's default initial state says
    planner = ResidencyPlanner(
        ResidencyPolicy(train_resident=False),
        tracked={"train", "rollout"},
        transitions={"train": module_transitions(trainer, "cpu"), "rollout": rollout_pair},
    )
    with planner.generation():
        pass
    planner.before_optimizer_step()
    train_bytes = sum(t.numel() * t.element_size() for t in train_snapshot)
    gen_bytes = sum(t.numel() * t.element_size() for t in _tensors(generator))
    assert [(r.role, r.kind, r.bytes) for r in planner.records] == [
        ("train", "offload", train_bytes),
        ("rollout", "onload", gen_bytes),
        ("rollout", "offload", gen_bytes),
        ("train", "onload", train_bytes),
    ]
    assert all(r.seconds >= 0 for r in planner.records)
    for t, ref in zip(_tensors(trainer), train_snapshot, strict=True):
        assert torch.equal(t, ref)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only rejection")
def test_cuda_device_without_cuda_is_rejected():
    with pytest.raises(ValueError, match="device"):
        module_transitions(nn.Linear(2, 2), "cuda")
    with pytest.raises(ValueError, match="device"):
        module_transitions(nn.Linear(2, 2), "not-a-device")
