"""Properties of the simulated schedules that a wrong schedule would violate."""

from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict

import pytest

from digenrl.plan import RunPlan
from digenrl.plan.workload import Workload
from digenrl.reports.validation import simulation_error
from digenrl.runtime.hardware.profiles import load_profile
from digenrl.runtime.observe.events import merge_chrome_trace, summarize_events
from digenrl.runtime.observe.span_phases import Phase
from digenrl.sim.simulator import compute_seconds, simulate
from tests.sim.toy_costs import toy_costs

H200_8 = load_profile("h200-8")


def _dyadic(rng: random.Random, lo: int = 1, hi: int = 16) -> float:
    """k/64: sums of a few of these are exact in binary floating point."""
    return rng.randint(lo, hi) / 64


def _workload(**kw) -> Workload:
    base = dict(
        prompts_per_iteration=4, group_size=2, num_steps=4, train_steps=2, cfg=False, micro_batch_size=2
    )
    return Workload(**{**base, **kw})


def _trained(spans):
    return [s for s in spans if s["iteration"] is not None]


def test_separate_sync_iteration_is_generate_plus_score_plus_train_exactly():
    rng = random.Random(2027)
    for _ in range(10):
        step, decode, reward, unit, opt = (_dyadic(rng) for _ in range(5))
        costs = toy_costs(step=step, decode=decode, reward=reward, unit=unit, optimizer=opt)
        generators, groups_per_gen = rng.choice([1, 2, 4]), rng.randint(1, 3)
        # every trainer gets samples of every generator (the runtime's check): at most 2 per group
        trainers = rng.randint(1, min(3, 2 * groups_per_gen))
        w = _workload(prompts_per_iteration=groups_per_gen * generators, iterations=4)
        samples = groups_per_gen * w.group_size  # per generator
        # every generator gives trainer 0 the largest part, ceil(samples / trainers) samples; the
        # all-reduce makes every trainer wait for it
        units_of_slowest_trainer = generators * -(-samples // trainers) * w.train_steps
        expected = (
            w.num_steps * step * samples + (decode + reward) * samples + unit * units_of_slowest_trainer + opt
        )
        result = simulate(
            H200_8, costs, w, RunPlan("separate-sync", trainers=trainers, generators=generators)
        )
        assert result.iteration_s == [expected] * w.iterations


def test_gap_strictly_shortens_the_iteration_and_gap_off_equals_the_barrier():
    """With >= 2 fragments per generator and training time > 0, streaming fragments beats the barrier.

    Holds for buffered sends whatever the bytes, and for rendezvous sends (runtime/comm/transfer.py) when
    moving a shard is free; with costly rendezvous sends a generator blocked on a busy trainer can lose
    the gain (the simulator shows it on some instances — a reason to pre-post receives in the runtime).
    """
    rng = random.Random(2028)
    for _ in range(10):
        fragment_bytes = rng.choice([0, 10**6])
        costs = toy_costs(
            step=rng.uniform(0.01, 0.2),
            decode=rng.uniform(0, 0.1),
            reward=rng.uniform(0, 0.1),
            unit=rng.uniform(0.01, 0.3),
            optimizer=rng.uniform(0, 0.2),
            fragment_bytes=fragment_bytes,
            unit_bytes=fragment_bytes // 2,  # K = 2 trained steps per sample below
            sync_bytes=rng.choice([0, 10**7]),
        )
        # >= 2 fragments *per generator*: with one fragment each, all fragments land at the same instant
        # and there is nothing to overlap (the simulator then predicts equal times, as it should).
        per_gen, fragment_groups = rng.randint(2, 3), rng.randint(1, 2)
        # every trainer needs a unit of every fragment (2 samples per group), as the runtime checks
        generators, trainers = rng.randint(1, 3), rng.randint(1, 2 * fragment_groups)
        w = _workload(prompts_per_iteration=per_gen * generators * fragment_groups, iterations=4)
        transports = ["buffered"] + (["rendezvous"] if fragment_bytes == 0 else [])
        for transport in transports:
            pools = {"trainers": trainers, "generators": generators, "transport": transport}
            sync = simulate(H200_8, costs, w, RunPlan("separate-sync", **pools))
            plan = RunPlan("digenrl", fragment_groups=fragment_groups, **pools)
            gap = simulate(H200_8, costs, w, plan)
            assert gap.steady_iteration_s < sync.steady_iteration_s, plan.describe()
            if fragment_bytes == 0:  # the same work at the same times without fragment traffic
                barrier = simulate(H200_8, costs, w, plan.with_(gap=False))
                samples_per_generator = per_gen * fragment_groups * w.group_size
                if samples_per_generator % trainers == 0:  # both split the units identically
                    assert barrier.steady_iteration_s == pytest.approx(sync.steady_iteration_s, rel=1e-9)
                else:  # separate-sync splits samples (first ranks +1), GAP deals units evenly
                    assert barrier.steady_iteration_s <= sync.steady_iteration_s * (1 + 1e-12)


def test_tsp_fill_and_drain_cost_s_minus_one_stage_slots():
    rng = random.Random(2029)
    for _ in range(10):
        stages, steps_per_stage, fragments = rng.randint(2, 4), rng.randint(1, 3), rng.randint(1, 6)
        step = _dyadic(rng)
        w = _workload(prompts_per_iteration=fragments, num_steps=stages * steps_per_stage, train_steps=1)
        plan = RunPlan("digenrl", trainers=1, generators=stages, fragment_groups=1, tsp_stages=stages)
        result = simulate(H200_8, toy_costs(step=step), w, plan)
        slot = steps_per_stage * step * w.group_size  # one fragment on one stage
        first = [s for s in result.spans if s["iteration"] == 0 and s["phase"] == "generate"]
        generation_end = max(s["t_end"] for s in first)
        assert generation_end == pytest.approx((fragments + stages - 1) * slot, rel=1e-12)
        for s in range(stages):
            starts = sorted(span["t_start"] for span in first if span["extra"]["stage"] == s)
            assert starts[0] == pytest.approx(s * slot, rel=1e-12)  # fill: stage s starts after s slots
            assert len(starts) == fragments


def test_tcss_keeps_every_trajectory_at_most_one_version_stale():
    rng = random.Random(2030)
    for stages in (1, 2):
        costs = toy_costs(
            step=0.05, unit=rng.uniform(0.05, 0.2), optimizer=0.3, decode=0.05, sync_bytes=10**8
        )
        w = _workload(prompts_per_iteration=8, num_steps=4, train_steps=3, iterations=6)
        plan = RunPlan("digenrl", trainers=2, generators=2 * stages, fragment_groups=1, tsp_stages=stages)
        for tcss in (False, True):
            result = simulate(H200_8, costs, w, plan.with_(tcss=tcss))
            generated = [s for s in result.spans if s["phase"] == "generate"]
            lags = {s["iteration"] - s["policy_version"] for s in generated}
            assert lags == ({0, 1} if tcss else {0})
            versions = defaultdict(set)
            for s in generated:
                versions[s["iteration"], s["fragment"]].add(s["policy_version"])
            assert all(len(v) == 1 for v in versions.values())  # one version per trajectory, every stage
            for s in result.spans:  # training of k never starts before step k−1 committed
                if s["phase"] == "train" and s["iteration"] > 0:
                    assert s["t_start"] >= result.iteration_end_s[s["iteration"] - 1] - 1e-12
        assert (
            simulate(H200_8, costs, w, plan.with_(tcss=True)).samples_per_s
            > simulate(H200_8, costs, w, plan).samples_per_s
        )


def test_tcss_planned_switch_binds_each_fragment_to_the_runtimes_version_and_waits_there():
    """The runtime's rule (StalenessBound.version_of): fragments [0, s) of iteration k use θ_{k−1}, the rest
    θ_k — a pipeline reaching fragment s before θ_k waits for it, a TAG helper takes only fragments ≥ s —
    whatever the costs; the timing switch never waits for weights, so it is never slower."""
    rng = random.Random(2033)
    for stages, tag in ((1, False), (2, False), (1, True)):
        # a long optimizer step: the trainer's tail outlasts the fragments before the switch
        costs = toy_costs(step=0.05, unit=rng.uniform(0.01, 0.05), optimizer=1.0, decode=0.05)
        w = _workload(prompts_per_iteration=8, num_steps=4, train_steps=3, iterations=6)
        plan = RunPlan(
            "digenrl", trainers=2, generators=2 * stages, fragment_groups=1, tsp_stages=stages, tcss=True
        )
        switch = 2 * stages  # one fragment per generator rank
        plan = (plan.with_tag_budget(2) if tag else plan).with_(tcss_switch=str(switch))
        planned = simulate(H200_8, costs, w, plan)
        generated = [s for s in planned.spans if s["phase"] == "generate"]
        for s in generated:
            k, f = s["iteration"], s["fragment"]
            assert s["policy_version"] == (k - 1 if k > 0 and f < switch else k), s
        helpers = [s for s in generated if s["extra"].get("helper")]
        assert bool(helpers) == tag and all(s["fragment"] >= switch for s in helpers if s["iteration"])
        generator_ranks = set(plan.generator_ranks(H200_8.world_size))
        waits = [s for s in planned.spans if s["phase"] == "wait_sync" and s["rank"] in generator_ranks]
        assert waits, "no pipeline waited for θ_k at the switch fragment"
        timing = simulate(H200_8, costs, w, plan.with_(tcss_switch="timing"))
        assert timing.samples_per_s >= planned.samples_per_s * (1 - 1e-9)
        assert {s["policy_version"] for s in timing.spans if s["phase"] == "generate"} <= set(range(6))
        everything = simulate(H200_8, costs, w, plan.with_(tcss_switch="auto"))  # s = F = 8
        generated = [s for s in everything.spans if s["phase"] == "generate"]
        assert all(s["policy_version"] == max(0, s["iteration"] - 1) for s in generated)
        if not tag:  # a larger switch never waits longer (with TAG it also takes the helpers' fragments)
            assert everything.samples_per_s >= planned.samples_per_s * (1 - 1e-9)
    with pytest.raises(ValueError, match=r"tcss\.switch"):
        simulate(H200_8, costs, w, plan.with_(tcss_switch="9"))


_HELPER_PHASES = ("score", "tag_switch", "optimizer", "sync")


def _trainer_head_idle(result) -> float:
    """Trainer-pool seconds without work between step k−1's end and k's first training span."""
    total = 0.0
    trainers = [r for r, role in result.log.roles.items() if role == "trainer"]
    for k in result.workload.steady_iterations:
        head_start = result.iteration_end_s[k - 1]
        for rank in trainers:
            spans = [s for s in result.spans if s["rank"] == rank]
            first_train = min(s["t_start"] for s in spans if s["phase"] == "train" and s["iteration"] == k)
            busy = sum(
                min(s["t_end"], first_train) - max(s["t_start"], head_start)
                for s in spans
                if ((s["phase"] == "generate" and s["extra"].get("helper")) or s["phase"] in _HELPER_PHASES)
                and s["t_end"] > head_start
                and s["t_start"] < first_train
            )
            total += (first_train - head_start) - busy
    return total


def test_tag_fills_the_trainer_head_bubble_and_never_lowers_throughput():
    rng = random.Random(2031)
    costs = toy_costs(step=0.1, decode=0.02, unit=0.01, optimizer=0.01, switch=rng.uniform(0, 0.05))
    w = _workload(prompts_per_iteration=12, num_steps=6, train_steps=4, iterations=5)
    plan = RunPlan("digenrl", trainers=2, generators=2, fragment_groups=1)
    off = simulate(H200_8, costs, w, plan)
    on = simulate(H200_8, costs, w, plan.with_(tag=True))
    assert on.plan.tag_budget(on.plan.num_fragments(w)) > 0
    assert on.samples_per_s > off.samples_per_s
    assert _trainer_head_idle(on) < _trainer_head_idle(off)
    helpers = [s for s in on.spans if s["phase"] == "generate" and s["extra"].get("helper")]
    assert all(on.log.roles[s["rank"]] == "trainer" for s in helpers)
    assert helpers and all(s["policy_version"] == s["iteration"] for s in helpers)  # bound to θ_k
    # when training is the bottleneck the budget search inserts no TAG at all
    busy_trainer = toy_costs(step=0.01, unit=0.5)
    assert not simulate(H200_8, busy_trainer, w, plan.with_(tag=True)).plan.tag


def _all_plans(world: int) -> list[RunPlan]:
    half = world // 2
    return [
        RunPlan("colocated-sync"),
        RunPlan("colocated-overlap", overlap_sub_batches=2),
        RunPlan("separate-sync", trainers=half, generators=world - half),
        RunPlan("separate-async", trainers=half, generators=world - half, max_staleness=4),
        RunPlan("digenrl", trainers=half, generators=world - half, fragment_groups=1),
        RunPlan("digenrl", trainers=half, generators=world - half, fragment_groups=1, tsp_stages=2),
        RunPlan(
            "digenrl",
            trainers=half,
            generators=world - half,
            tag=True,
            tag_policy="always",
            tag_max_fragments=1,
            tcss=True,
        ),
    ]


def test_busy_gpu_seconds_are_conserved_across_schedules():
    rng = random.Random(2032)
    step, decode, reward, unit = (rng.uniform(0.01, 0.2) for _ in range(4))
    costs = toy_costs(step=step, decode=decode, reward=reward, unit=unit)
    profile = load_profile("cpu-4")
    w = _workload(prompts_per_iteration=8, num_steps=4, train_steps=3, iterations=4)
    expected = w.iterations * (
        w.samples_per_iteration * (w.num_steps * step + decode + reward) + w.units_per_iteration * unit
    )
    for plan in _all_plans(profile.world_size):
        result = simulate(profile, costs, w, plan)
        assert compute_seconds(_trained(result.spans)) == pytest.approx(expected, rel=1e-9), plan.describe()


def _moving_costs():
    """Costs with bytes to move: transfers, syncs, residency and switches take time."""
    return toy_costs(
        step=0.05,
        decode=0.02,
        reward=0.01,
        unit=0.03,
        optimizer=0.02,
        fragment_bytes=10**7,
        unit_bytes=10**7,
        cond_bytes=10**6,
        latent_bytes=10**6,
        sync_bytes=10**8,
        grad_bytes=10**8,
        optimizer_bytes=10**9,
    )


def test_a_device_never_runs_two_things_at_once():
    costs = _moving_costs()
    profile = load_profile("cpu-4")
    w = _workload(prompts_per_iteration=8, iterations=4)
    compute = (Phase.GENERATE, Phase.SCORE, Phase.TRAIN, Phase.OPTIMIZER, Phase.TAG_SWITCH, Phase.RESIDENCY)
    for plan in _all_plans(profile.world_size):
        result = simulate(profile, costs, w, plan)
        by_rank = defaultdict(list)
        for s in result.spans:
            if s["phase"] in compute and not s.get("extra", {}).get("background"):
                by_rank[s["rank"]].append((s["t_start"], s["t_end"]))
        for intervals in by_rank.values():
            intervals.sort()
            for (_, end), (start, _) in itertools.pairwise(intervals):
                assert start >= end - 1e-12, plan.describe()


def test_every_phase_the_schedules_emit_is_declared():
    """Every span name of every system's schedule is a declared Phase
    (digenrl/runtime/observe/span_phases.py), and the schedules reach the names the summaries, TAG and the
    figures group by."""
    profile = load_profile("cpu-4")
    plans = [
        *_all_plans(profile.world_size),
        RunPlan("colocated-sync", train_resident=False),
        RunPlan("colocated-engine"),
    ]
    w = _workload(prompts_per_iteration=8, iterations=3)
    emitted = {s["phase"] for plan in plans for s in simulate(profile, _moving_costs(), w, plan).spans}
    assert emitted <= set(Phase)
    expected = {Phase.GENERATE, Phase.SCORE, Phase.TRAIN, Phase.OPTIMIZER, Phase.SYNC, Phase.TRANSFER}
    expected |= {Phase.TAG_SWITCH, Phase.RESIDENCY, Phase.OFFLOAD, Phase.ONLOAD, Phase.RESHARD}
    expected |= {Phase.WAIT_FRAGMENT, Phase.WAIT_STAGE, Phase.WAIT_TRANSFER, Phase.WAIT_SYNC}
    assert expected <= emitted, sorted(expected - emitted)


def test_emitted_spans_pass_the_real_summary_and_trace(tmp_path):
    costs = toy_costs(
        step=0.05,
        decode=0.02,
        unit=0.03,
        optimizer=0.02,
        fragment_bytes=10**6,
        unit_bytes=10**6,
        sync_bytes=10**7,
    )
    profile = load_profile("cpu-4")
    w = _workload(prompts_per_iteration=8, iterations=4)
    for i, plan in enumerate(_all_plans(profile.world_size)):
        result = simulate(profile, costs, w, plan)
        out = tmp_path / f"run{i}"
        result.write_events(out)
        summary = summarize_events(out)
        assert sorted(summary) == list(range(w.iterations)), plan.describe()
        for k, it in summary.items():
            assert it["samples"]["score"] == w.samples_per_iteration, (plan.describe(), k)
            assert it["samples"]["optimizer"] == w.samples_per_iteration
            assert all(0.0 <= f <= 1.0 + 1e-9 for f in it["busy_fraction"].values())
            assert it["wall_s"] > 0
        trace = merge_chrome_trace(out)
        assert trace.is_file()


def test_colocated_overlap_hides_scoring_behind_generation():
    rng = random.Random(2033)
    costs = toy_costs(step=rng.uniform(0.05, 0.1), decode=rng.uniform(0.01, 0.05), reward=0.02, unit=0.01)
    w = _workload(prompts_per_iteration=8, iterations=3)
    sync = simulate("cpu-2", costs, w, RunPlan("colocated-sync"))
    overlap = simulate("cpu-2", costs, w, RunPlan("colocated-overlap", overlap_sub_batches=4))
    hidden = 3 * (costs.score_s(w.group_size))  # 4 sub-batches of one group each: 3 of 4 scores overlap
    assert overlap.steady_iteration_s == pytest.approx(sync.steady_iteration_s - hidden, rel=1e-9)


def test_colocated_engine_pays_its_switch_and_nothing_else():
    """LoRA, equal work on cpu-2: an engine iteration is colocated-sync's plus its switch, priced from bytes —
    optimizer state and generation copy each off and on over ``links.host_device_gbps``, the adapter copied
    once over ``hbm_gbps`` (read + write) — and the cost file's measured switch costs replace the modelled
    ones; with both copies resident only the re-shard remains."""
    from dataclasses import replace

    rng = random.Random(2040)
    costs = replace(
        toy_costs(
            step=0.05, decode=0.01, reward=0.01, unit=0.02, optimizer_bytes=3 * 10**9, sync_bytes=10**8
        ),
        param_bytes=4 * 10**9,
    )
    w = _workload(prompts_per_iteration=4, iterations=4)
    profile = load_profile("cpu-2")
    host, hbm = profile.links.host_device_gbps * 1e9, profile.device_type(0).hbm_gbps * 1e9
    sync = simulate(profile, costs, w, RunPlan("colocated-sync"))
    engine = simulate(profile, costs, w, RunPlan("colocated-engine"))
    reshard = 2 * 10**8 / hbm
    switch = 2 * (3e9 + 4e9) / host + reshard
    assert engine.steady_iteration_s == pytest.approx(sync.steady_iteration_s + switch, rel=1e-9)
    resident = simulate(profile, costs, w, RunPlan("colocated-engine", engine_offload=False))
    assert resident.steady_iteration_s == pytest.approx(sync.steady_iteration_s + reshard, rel=1e-9)
    phases = {s["phase"] for s in engine.spans}
    assert {"offload", "onload", "reshard"} <= phases
    # measured (experiments/measure.py switch): its bandwidths and re-shard time are used instead
    off, on, measured_reshard = rng.uniform(5, 50), rng.uniform(5, 50), rng.uniform(0.01, 0.1)
    meta = {
        "engine_switch": {"lora": {"offload_gbps": off, "onload_gbps": on, "reshard_s": measured_reshard}}
    }
    measured = simulate(profile, replace(costs, meta=meta), w, RunPlan("colocated-engine"))
    switch = (3e9 + 4e9) / (off * 1e9) + (3e9 + 4e9) / (on * 1e9) + measured_reshard
    assert measured.steady_iteration_s == pytest.approx(sync.steady_iteration_s + switch, rel=1e-9)


def test_colocated_engine_full_finetune_generates_without_gathers_and_parks_its_shards():
    """Full fine-tuning on 2 ranks (FSDP2): colocated-sync's generation gathers the sharded weights every
    forward, the engine's generation copy holds them whole (no gathers); the engine parks its half of the
    weights and all-gathers them into the copy once per iteration."""
    from dataclasses import replace

    costs = replace(
        toy_costs(step=0.05, unit=0.02, optimizer_bytes=2 * 10**9, sync_bytes=10**9), param_bytes=10**9
    )
    w = _workload(prompts_per_iteration=4, iterations=4, trainer_mode="full")
    profile = load_profile("cpu-2")
    engine = simulate(profile, costs, w, RunPlan("colocated-engine"))
    sync = simulate(profile, costs, w, RunPlan("colocated-sync"))
    generate = {s["phase"]: s["t_end"] - s["t_start"] for s in engine.spans if s["iteration"] == 1}
    samples = w.samples_per_iteration // 2
    assert generate["generate"] == pytest.approx(w.num_steps * 0.05 * samples, rel=1e-9)
    sync_generate = [s["t_end"] - s["t_start"] for s in sync.spans if s["phase"] == "generate"]
    assert min(sync_generate) > generate["generate"]  # its forwards wait for the weight gathers
    weights = [s for s in engine.spans if s["phase"] == "offload" and s["extra"]["what"] == "trainer weights"]
    assert {s["extra"]["bytes"] for s in weights} == {10**9 // 2}
    intra = profile.links.intra_node_gbps * 1e9
    reshard = [s["t_end"] - s["t_start"] for s in engine.spans if s["phase"] == "reshard"]
    expected = 2 * 10**9 / (profile.device_type(0).hbm_gbps * 1e9) + 0.5 * 10**9 / intra
    assert reshard == pytest.approx([expected] * (2 * w.iterations), rel=1e-9)


def test_separate_async_reap_before_launch_and_staleness_budget():
    costs = toy_costs(step=0.05, decode=0.02, unit=0.05, optimizer=0.02, fragment_bytes=4 * 10**8)
    w = _workload(prompts_per_iteration=8, iterations=10)
    # UniRL's recipe (docs/references.md [000]): sync every 4 steps; launching before reaping stalls the
    # transfer
    plan = RunPlan("separate-async", trainers=2, generators=2, max_staleness=1, weight_sync_interval=4)
    reap_first = simulate("cpu-4", costs, w, plan)
    launch_first = simulate("cpu-4", costs, w, plan.with_(reap_before_launch=False))
    assert reap_first.samples_per_s > launch_first.samples_per_s
    # staleness 0 evicts the drained batch at every sync: a cold rollout per sync window
    assert simulate("cpu-4", costs, w, plan.with_(max_staleness=0)).samples_per_s < reap_first.samples_per_s
    plan = plan.with_(weight_sync_interval=1)
    for staleness in (0, 1):
        result = simulate("cpu-4", costs, w, plan.with_(max_staleness=staleness))
        lags = {
            s["extra"]["staleness"]
            for s in result.spans
            if s["phase"] == "generate" and s["iteration"] is not None
        }
        assert lags == ({0} if staleness == 0 else {0, 1})
        evicted = [s for s in result.spans if s.get("extra", {}).get("evicted")]
        assert bool(evicted) == (staleness == 0)  # a zero budget throws the drained batch away


def test_heterogeneous_pipeline_gives_the_faster_gpu_more_steps():
    profile = load_profile("hetero-h100-a100-16")
    from digenrl.costs.device_costs import DeviceCosts

    costs = DeviceCosts(profile, toy_costs(step=0.1, unit=0.01, device="h100"), reference_type="h100")
    w = _workload(prompts_per_iteration=6, group_size=8, num_steps=12, train_steps=4, iterations=3)
    plan = RunPlan("digenrl", trainers=7, generators=9, tsp_stages=3)
    result = simulate(profile, costs, w, plan)
    steps = {}
    for s in result.spans:
        if s["phase"] == "generate" and s["rank"] in (7, 8, 9):  # pipeline 0: h100, a100, a100
            lo, hi = s["extra"]["steps"]
            steps[s["rank"]] = hi - lo
    assert steps[7] > steps[8] and steps[7] > steps[9]
    assert sum(steps.values()) == w.num_steps


def test_plan_validation_names_the_problem():
    w = _workload()
    with pytest.raises(ValueError, match="tsp_stages"):
        simulate(H200_8, toy_costs(), w, RunPlan("digenrl", trainers=2, generators=3, tsp_stages=2))
    with pytest.raises(ValueError, match="exceeds"):
        simulate(H200_8, toy_costs(), w, RunPlan("separate-sync", trainers=4, generators=5))
    with pytest.raises(ValueError, match="system"):
        RunPlan("pipedream")


def test_simulation_error_reads_real_format_logs(tmp_path):
    """A run compared with its own event log has zero error; stretching every span by 10% (a slower
    "measured" run) gives simulated/measured − 1 = +10% on throughput and −1/11 on every phase."""
    costs = toy_costs(step=0.05, decode=0.02, unit=0.03, optimizer=0.02, unit_bytes=10**6)
    w = _workload(prompts_per_iteration=8, iterations=5)
    result = simulate("cpu-4", costs, w, RunPlan("digenrl", trainers=2, generators=2))
    result.write_events(tmp_path / "same")
    same = simulation_error(result, tmp_path / "same")
    assert same["relative_error"] == pytest.approx(0.0, abs=1e-12)
    slow = tmp_path / "slow" / "events"
    slow.mkdir(parents=True)
    for path in (tmp_path / "same" / "events").glob("rank*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["type"] == "span":
                record["t_start"] *= 1.1
                record["t_end"] *= 1.1
            lines.append(json.dumps(record))
        (slow / path.name).write_text("\n".join(lines) + "\n")
    error = simulation_error(result, tmp_path / "slow")
    assert error["relative_error"] == pytest.approx(0.1, rel=1e-9)
    train = error["phases"]["trainer"]["train"]
    assert train["relative_error"] == pytest.approx(1 / 1.1 - 1, rel=1e-9)
