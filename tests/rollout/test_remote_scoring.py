"""A scorer rank computes exactly what local scoring computes: a fragment's final latents go to it, its
rewards and keep mask come back, over the same transport as every fragment (gloo, two processes)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from digenrl.rewards import build_reward
from digenrl.rollout.remote_scoring import ScorerPool, ScoringServer, scoring_request
from digenrl.rollout.scoring import Scorer
from digenrl.runtime.comm.control_plane import ControlPlane
from digenrl.runtime.observe.events import EventLogger
from tests.runtime.spawn import spawn_workers
from tests.tsp.fixtures import PROMPTS, bundle, make_config, make_engine


def _fragment(seed: int):
    engine = make_engine(make_config("sampler.guidance_scale=1.0", f"seed={seed}"))
    return engine.generate(PROMPTS[:2], [0, 1], iteration=5, policy_version=2)


def _scorer() -> Scorer:
    return Scorer(bundle().decoder, build_reward("jpeg-incompressibility"), "drop-group")


def _worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        plane = ControlPlane(dist.FileStore(f"{tmp}/plane", world), rank, "scoring-test", 30.0)
        if rank == 0:  # the producer: two fragments to scorer rank 1, compared with local scoring
            pool = ScorerPool(plane, (1,), timeout_s=30)
            out = {}
            for fragment, seed in ((0, 3), (1, 4)):
                batch = _fragment(seed)
                remote, local = pool.score(batch, 5, fragment), _scorer()(batch)
                out[fragment] = (remote.rewards, local.rewards, remote.keep, local.keep)
            torch.save(out, f"{tmp}/result.pt")
        else:  # the scorer
            server = ScoringServer(_scorer(), plane, device=torch.device("cpu"), timeout_s=30)
            events = EventLogger(tmp, rank, "scorer", 0.0)
            served = [server.serve_one(events, 5) for _ in range(2)]
            events.close()
            torch.save(served, f"{tmp}/served.pt")
    finally:
        dist.destroy_process_group()


def test_a_scorer_rank_returns_what_local_scoring_computes(tmp_path):
    spawn_workers(_worker, 2, (str(tmp_path),), limit_s=120)
    result = torch.load(tmp_path / "result.pt")
    for remote, local, remote_keep, local_keep in result.values():
        assert torch.equal(remote, local) and torch.equal(remote_keep, local_keep) and remote.numel() == 4
    assert torch.load(tmp_path / "served.pt") == [(5, 0, 4), (5, 1, 4)]
    spans = (tmp_path / "events" / "rank1.jsonl").read_text()
    assert spans.count('"phase":"score"') == 2 and spans.count('"phase":"wait_request"') == 2


def test_a_scoring_request_carries_no_transition_records():
    batch = _fragment(7)
    request = scoring_request(batch)
    assert request.num_train_steps == 0 and request.num_units == 0
    assert torch.equal(request.final_latents, batch.final_latents) and request.prompts == batch.prompts
