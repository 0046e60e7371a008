"""TAG as one component (digenrl/tag/component.py): the first trainer decides the iteration's budget and
the others follow it through the control plane; the helper generates from the tail within the budget and
above TCSS's head-only fragments; its costs reach the policy through the span records alone; metrics."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from digenrl.async_policy.tcss import StalenessBound
from digenrl.config import ConfigError
from digenrl.data.prompts import PromptSource
from digenrl.gap.fragments import FragmentPlan
from digenrl.gap.helper_share import helper_may_claim
from digenrl.gap.stream import FragmentStream
from digenrl.plan import RunPlan
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.comm.errors import DistributedTimeoutError
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.events import EventLogger, load_events
from digenrl.sim.predict import SimPredictor
from digenrl.tag.component import Tag, check_tag_config, tag_wanted
from digenrl.tag.policy import TagPolicy
from digenrl.trainer import PolicyTrainer
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine

CFG = [
    "trainer.lora_rank=4",
    "sampler.guidance_scale=1.0",
    "algo.prompts_per_iteration=4",
    "gap.fragment_groups=1",
]


def _plan(cfg) -> RunPlan:
    """The plan of ``cfg`` as a ``digenrl`` run on two ranks (one trainer, one generator)."""
    return RunPlan.from_config(dataclasses.replace(cfg, system="digenrl"), load_profile("cpu-2"))


def _policy(cfg, trainers=(0,)) -> TagPolicy:
    profile = load_profile("cpu-2")
    return TagPolicy(
        cfg,
        _plan(cfg),
        profile,
        trainer_ranks=trainers,
        generator_ranks=(1,),
        num_fragments=4,
        fragment_samples=2,
        trainer_type=profile.device_type(0).name,
        predictor=SimPredictor.for_run(cfg, profile),
    )


def test_the_first_trainer_decides_the_budget_and_the_others_follow_it(tmp_path):
    store = torch.distributed.HashStore()
    for max_fragments, budget in ((2, 2), (0, None)):
        cfg = make_config(*CFG, "tag.policy=always", f"tag.max_fragments={max_fragments}")
        first, other = (
            Tag(
                policy=_policy(cfg, (0, 1)) if rank == 0 else None,
                plane=ControlPlane(store, rank, "trainer"),
                events=EventLogger(tmp_path / str(max_fragments), rank, "trainer", 0.0),
                trainer_ranks=(0, 1),
            )
            for rank in (0, 1)
        )
        assert first.publish_budget(5).budget == budget
        assert other.publish_budget(5).budget == budget
        first.events.close()
        (note,) = [r for r in load_events(tmp_path / str(max_fragments)) if r["type"] == "note"]
        assert note["kind"] == "tag" and note["iteration"] == 5 and note["budget"] == budget


def test_a_trainer_waiting_for_a_budget_nobody_publishes_times_out_naming_it(tmp_path):
    plane = ControlPlane(torch.distributed.HashStore(), 1, "trainer", default_timeout_s=0.2)
    tag = Tag(plane=plane, events=EventLogger(tmp_path, 1, "trainer", 0.0), trainer_ranks=(0, 1))
    with pytest.raises(DistributedTimeoutError, match=r"rank 1 .*TAG budget of the iteration"):
        tag.publish_budget(0)


def _helping_tag(tmp_path, *overrides, bound=None, held=(0, 1)):
    """A one-trainer TAG over 4 one-group fragments; generator rank 1 announced the versions ``held``."""
    cfg = make_config(*CFG, *overrides)
    model = copy.deepcopy(bundle().flow_model)
    engine = make_engine(cfg, flow_model=model)
    trainer = PolicyTrainer(cfg, model, engine.sampler, uncond=None, device="cpu")
    plane = ControlPlane(torch.distributed.HashStore(), 0, "trainer")
    stream = FragmentStream(
        FragmentPlan(4, 1, 1), plane, (0,), sharding="units", device=torch.device("cpu"), timeout_s=5
    )
    for version in held:
        stream.announce_held(version)
    events = EventLogger(tmp_path, 0, "trainer", 0.0)
    tag = Tag.build(
        cfg,
        _plan(cfg),
        engine=engine,
        backend=trainer.backend,
        stream=stream,
        events=events,
        profile=load_profile("cpu-2"),
        generator_ranks=(1,),
        group=None,
        bound=bound or StalenessBound(0, iterations=8),
        prompts=PromptSource(PROMPTS, seed=0),
    )
    return tag, events


def test_the_helper_generates_from_the_tail_within_the_budget_and_the_policy_sees_it_in_the_spans(tmp_path):
    tag, events = _helping_tag(tmp_path, "tag.policy=always", "tag.max_fragments=2")
    assert tag.on and tag.describe() == "TAG always"
    tag.begin(3, 0)
    made = [tag.help(), tag.help()]
    assert [m.fragment for m in made] == [3, 2] and all(m.version == 0 for m in made)
    assert tag.help() is None  # the budget is spent
    tag.leave()
    metrics = tag.metrics()
    assert metrics["tag_fragments"] == 2.0 and metrics["tag_budget"] == 2.0
    assert metrics["tag_switches"] == 2.0 and metrics["tag_switch_s"] > 0  # in once, out once
    observed = tag.policy.observed  # nothing called the policy: it read the helper's spans
    assert len(observed.helper_steps_s) == 2 and len(observed.switch_s) == 2
    events.close()
    helper_spans = [r for r in load_events(tmp_path) if r.get("phase") == "generate"]
    assert [s["t_end"] - s["t_start"] for s in helper_spans] == pytest.approx(observed.helper_steps_s)


def test_the_helper_claims_only_fragments_the_plan_binds_to_its_own_version(tmp_path):
    tcss = StalenessBound(1, iterations=8, switch=3)  # iteration 1: fragments 0..2 use θ_0 (the pipelines')
    tag, _ = _helping_tag(tmp_path, "tag.policy=always", bound=tcss)
    tag.begin(1, 1)
    assert tag.help().fragment == 3 and tag.help() is None  # no budget limit, but nothing else to take
    tag.leave()


def test_the_helper_waits_until_the_generators_hold_its_version(tmp_path):
    """The race of issue 24: a trainer that starts iteration k early claims nothing before every generator
    holds θ_k; then it helps (and says it was waiting, so the trainer asks again)."""
    tag, _ = _helping_tag(tmp_path, "tag.policy=always", held=(0,))
    tag.begin(1, 1)
    assert tag.help() is None and tag.waiting
    tag.stream.announce_held(1)
    made = tag.help()
    assert made is not None and made.fragment == 3 and not tag.waiting
    tag.leave()


def _span(phase: str, seconds: float, **extra) -> dict:
    return {"phase": phase, "t_start": 0.0, "t_end": seconds, "samples": 4, "extra": extra}


def test_the_helper_leaves_the_generators_what_they_finish_sooner(tmp_path):
    """By the measured costs: the generator pipeline makes a fragment in 0.1 s, this rank in 5 s — the
    generators reach every one of the 4 fragments left first, so the helper takes none; a slow pipeline
    (10 s a fragment) leaves the tail to the helper."""
    tag, _ = _helping_tag(tmp_path, "tag.policy=always")
    policy = tag.policy
    policy.observe(_span("generate", 5.0, helper=True))
    policy.observe(_span("wait_fragment", 0.0, producer=1, steps_s=0.1, score_s=0.0, bytes=64))
    assert policy.fragment_seconds() == (pytest.approx(0.1), pytest.approx(5.0))
    tag.begin(0, 0)
    assert tag.help() is None and not tag.waiting
    for _ in range(4):
        policy.observe(_span("wait_fragment", 0.0, producer=1, steps_s=10.0, score_s=0.0, bytes=64))
    assert tag.help().fragment == 3  # 4 rounds x 10 s > 5 s
    assert tag.help().fragment == 2  # 3 rounds still
    tag.leave()


def test_helper_may_claim_rules():
    assert not helper_may_claim(0, 2, None, None)
    assert not helper_may_claim(2, 2, None, None) and helper_may_claim(
        3, 2, None, None
    )  # unmeasured: backlog
    assert helper_may_claim(3, 2, 1.0, 1.9) and not helper_may_claim(3, 2, 1.0, 2.0)  # 2 rounds x 1 s
    # a pipeline busy with a fragment in flight starts the queue's next one only after it
    assert not helper_may_claim(2, 2, 1.0, 1.5) and helper_may_claim(2, 2, 1.0, 1.5, in_flight=2)
    with pytest.raises(ValueError, match="pipelines must be >= 1"):
        helper_may_claim(1, 0, None, None)


def test_tag_off_never_helps_and_reports_nothing():
    off = Tag()
    off.begin(0, 0)
    assert not off.on and off.help() is None and off.metrics() == {} and off.describe() == "TAG off"
    off.leave()


def test_startup_checks_and_whether_trainers_build_an_engine():
    with pytest.raises(ConfigError, match=r"tag.enabled=true needs gap.assignment=dynamic"):
        check_tag_config(_plan(make_config("gap.assignment=round-robin")), "ddp")
    with pytest.raises(ConfigError, match=r"tag.policy=always cannot run: trainer backend 'deepspeed'"):
        check_tag_config(_plan(make_config("tag.policy=always")), "deepspeed")
    check_tag_config(_plan(make_config("tag.policy=auto")), "deepspeed")  # auto: TAG turns itself off instead
    assert tag_wanted(_plan(make_config()), "ddp", announce=False)
    assert not tag_wanted(_plan(make_config("tag.policy=auto")), "deepspeed", announce=False)
    assert not tag_wanted(_plan(make_config("tag=false")), "ddp", announce=False)
