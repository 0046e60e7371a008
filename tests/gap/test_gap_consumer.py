"""The trainer side of GAP (digenrl/gap/consumer.py): the training order, training on arrival in whole
micro-batches across fragments (or after the last fragment with GAP off), the inner epochs replaying the
same shards through :func:`~digenrl.systems.phases.train_logical_batch`, every shard checked against the
staleness bound, and the ``wait_fragment`` span naming the producer's measured costs."""

from __future__ import annotations

import pytest
import torch

from digenrl.async_policy.tcss import StalenessBound, StalenessError
from digenrl.config import ConfigError, load_config
from digenrl.gap.consumer import FragmentConsumer, check_gap_config
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.stream import FragmentStream
from digenrl.plan import RunPlan
from digenrl.rewards import registry
from digenrl.rewards.base import RewardFunction
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.events import EventLogger, load_events
from digenrl.systems.phases import train_logical_batch
from tests.gap.test_gap_unit_sharding import _synthetic

ITERATION, VERSION = 3, 3
UNITS = 4  # per fragment: 2 samples x 2 trained steps


class Recorder:
    """Stands in for :class:`~digenrl.systems.phases.Accumulation` (its ``train`` and ``step``): records the
    unit batches handed to training and the steps, so the order and grouping can be checked."""

    def __init__(self) -> None:
        self.trained: list[list[int]] = []  # per train call: the seeds of its units
        self.steps = 0

    def train(self, units) -> None:
        self.trained.append(units.seeds.tolist())

    def step(self) -> dict[str, float]:
        self.steps += 1
        return {"steps": float(self.steps)}


def _consumer(tmp_path, *, order="index", streaming=True, micro_batch_size=3, pack=True, bound=None):
    plane = ControlPlane(torch.distributed.HashStore(), 0, "trainer")
    stream = FragmentStream(
        FragmentPlan(4, 1, 1), plane, (0,), sharding="units", device=torch.device("cpu"), timeout_s=5
    )
    events = EventLogger(tmp_path, 0, "trainer", 0.0)
    bound = bound or StalenessBound(0, iterations=8)
    consumer = FragmentConsumer(
        stream,
        bound,
        events,
        train_order=order,
        streaming=streaming,
        micro_batch_size=micro_batch_size,
        pack=pack,
    )
    return consumer, stream, events


def _ship(stream: FragmentStream, fragment: int, version: int = VERSION) -> None:
    """A producer (here this rank itself: its shard stays local) ships ``fragment`` with its costs."""
    batch = _synthetic(2, 2, 4, shared_steps=True)
    batch.iteration, batch.policy_version = ITERATION, torch.full((2,), version)
    batch.seeds = torch.tensor([10 * fragment, 10 * fragment + 1])
    tags = {"policy_version": version, "producer": 7, "steps_s": 1.5, "score_s": 0.25}
    stream.ship(batch, ITERATION, fragment, tags=tags)


def test_index_order_waits_for_the_lowest_fragment_arrival_order_takes_what_is_here(tmp_path):
    for order, expected in (("index", 0), ("arrival", 2)):
        consumer, stream, _ = _consumer(tmp_path / order, order=order)
        consumer.begin(ITERATION, VERSION, train=Recorder().train)
        _ship(stream, 2)
        _ship(stream, 3)
        assert consumer.next() == expected and consumer.ready(expected) == (order == "arrival")
    consumer.receive(2)
    assert consumer.next() == 3 and consumer.pending == [0, 1, 3]


@pytest.mark.parametrize("streaming", [True, False])
def test_gap_trains_each_fragment_on_arrival_in_whole_micro_batches_and_the_epochs_replay_it(
    tmp_path, streaming
):
    consumer, stream, _ = _consumer(tmp_path, streaming=streaming)
    training = Recorder()
    consumer.begin(ITERATION, VERSION, train=training.train)
    for f in (1, 0, 3, 2):
        _ship(stream, f)
    arrived = []
    while (f := consumer.next()) is not None:
        consumer.receive(f)
        arrived.append(len(training.trained))
    assert arrived == ([1, 2, 3, 4] if streaming else [0, 0, 0, 0])  # GAP off: nothing before the last
    step = train_logical_batch(training, consumer.received, 2, packer=consumer.packer, fed=streaming)
    assert step == {"steps": 2.0} and training.steps == 2
    one_pass = [seed for shard in consumer.received for seed in shard.seeds.tolist()]
    assert len(one_pass) == 4 * UNITS and set(one_pass) == {0, 1, 10, 11, 20, 21, 30, 31}
    trained = [seed for call in training.trained for seed in call]
    assert trained == one_pass + one_pass  # each pass: every unit once, in the order the fragments came
    # whole micro-batches of 3 across fragment boundaries (4 units + 1 carried = 3 trained, …); the pass's
    # remainder trains before its step
    assert [len(call) for call in training.trained] == [3, 3, 6, 3, 1] * 2


def test_unpacked_every_shard_trains_as_it_comes(tmp_path):
    consumer, stream, _ = _consumer(tmp_path, pack=False)  # a lockstep backend: one accumulate per shard
    training = Recorder()
    consumer.begin(ITERATION, VERSION, train=training.train)
    for f in range(4):
        _ship(stream, f)
        consumer.receive(consumer.next())
    assert [len(call) for call in training.trained] == [UNITS] * 4


def test_every_shard_is_checked_against_the_staleness_bound_and_counted(tmp_path):
    bound = StalenessBound(1, iterations=8, switch=2)  # TCSS: fragments 0, 1 of iteration 3 use θ_2
    consumer, stream, _ = _consumer(tmp_path, bound=bound)
    consumer.begin(ITERATION, VERSION, train=Recorder().train)
    _ship(stream, 0, version=2)
    _ship(stream, 2, version=3)
    _ship(stream, 1, version=3)  # not the plan's version
    consumer.receive(0)
    consumer.receive(2)
    assert consumer.staleness.metrics() == {"staleness_max": 1.0, "stale_fraction": 0.5}
    with pytest.raises(StalenessError, match=r"fragment 1 of iteration 3 .* binds it to version 2"):
        consumer.receive(1)


def test_the_wait_fragment_span_names_the_producer_and_its_costs(tmp_path):
    consumer, stream, events = _consumer(tmp_path)
    consumer.begin(ITERATION, VERSION, train=Recorder().train)
    _ship(stream, 0)
    consumer.receive(0)
    events.close()
    (span,) = [r for r in load_events(tmp_path) if r.get("phase") == "wait_fragment"]
    assert span["fragment"] == 0 and span["iteration"] == ITERATION and span["samples"] == UNITS
    assert span["extra"] == {"producer": 7, "steps_s": 1.5, "score_s": 0.25, "bytes": 0}  # local: no bytes


def _check_gap(cfg, trainers: int, *, lockstep: bool = False) -> None:
    """:func:`check_gap_config` of ``cfg`` and its plan (the knobs a system reads from it)."""
    check_gap_config(cfg, RunPlan.from_config(cfg, load_profile("cpu-2")), trainers, lockstep=lockstep)


def test_gap_config_checks_name_the_keys():
    with pytest.raises(ConfigError, match=r"algo\.adv_std=group"):
        _check_gap(load_config(None, ["system=digenrl", "algo.adv_std=global"]), 1)
    # a fragment need not hold a unit for every trainer (a trainer with none skips it): 2 samples, 3 trainers
    small = load_config(None, ["system=digenrl", "gap.fragment_groups=1", "algo.group_size=2"])
    _check_gap(small, 3)
    # ... except under a sharded (lockstep) trainer, where every accumulate is a collective on every rank
    with pytest.raises(ConfigError, match=r"gap\.fragment_groups=1 makes fragments of 2 samples, fewer than"):
        _check_gap(small, 3, lockstep=True)


class _GroupRanking(RewardFunction):
    """A reward that ranks a group's samples against each other (test double: only its flag is read;
    registered for one test only, so no other test sees it among the rewards)."""

    name = "test-group-ranking"
    needs_whole_group = True

    def score_images(self, images, prompts):
        return images.mean(dim=(1, 2, 3)).argsort().argsort().float()


def test_sub_group_fragments_refuse_a_reward_that_needs_the_whole_group(monkeypatch):
    registry.available_rewards()  # the built-ins first
    monkeypatch.setitem(registry._REGISTRY, _GroupRanking.name, _GroupRanking)
    overrides = ["system=digenrl", "algo.group_size=4", "reward.name=test-group-ranking"]
    with pytest.raises(ConfigError, match=r"gap\.fragment_samples=2 splits .* 'test-group-ranking'"):
        _check_gap(load_config(None, [*overrides, "gap.fragment_samples=2"]), 1)
    _check_gap(load_config(None, [*overrides, "gap.fragment_samples=8"]), 1)  # whole groups


def test_an_unknown_training_order_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"gap.train_order='random': choose one of \('index', 'arrival'\)"):
        _consumer(tmp_path, order="random")
