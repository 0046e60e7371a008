"""colocated-overlap's scorer stream (``runtime.score_stream``, digenrl/systems/colocated_overlap.py): the
worker thread scores on its own CUDA stream, only after the event recorded when its sub-batch was generated.

No GPU here: torch.cuda's Stream / Event / stream context are replaced by fakes that log what the code asks
of them, per thread, so the order (record on the generating thread, wait on the side stream, then score) is
what is checked."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.systems.colocated_overlap import ScoreStream
from digenrl.validation import check_unread_knobs


class FakeCuda:
    """Stands in for torch.cuda's stream API; ``log`` holds (thread name, what, current stream)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, object]] = []
        self.local = threading.local()
        fake = self

        class Stream:
            def __init__(self, device=None) -> None:
                self.name = f"side({device})"

            def wait_event(self, event) -> None:
                fake.note(f"wait {event.name}")

        class Event:
            count = 0

            def __init__(self) -> None:
                Event.count += 1
                self.name = f"event{Event.count}"

            def record(self) -> None:
                fake.note(f"record {self.name}")

        class StreamContext:
            def __init__(self, stream) -> None:
                self.stream = stream

            def __enter__(self):
                self.before = fake.current()
                fake.local.current = self.stream.name

            def __exit__(self, *exc):
                fake.local.current = self.before

        self.Stream, self.Event, self.stream = Stream, Event, StreamContext

    def current(self) -> str:
        return getattr(self.local, "current", "default")

    def note(self, what: str) -> None:
        self.log.append((threading.current_thread().name, what, self.current()))


@pytest.fixture
def fake_cuda(monkeypatch) -> FakeCuda:
    fake = FakeCuda()
    for name in ("Stream", "Event", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_the_worker_scores_on_the_side_stream_after_its_sub_batch(fake_cuda):
    stream = ScoreStream(torch.device("cuda", 0), enabled=True)

    def score(j: int) -> int:
        fake_cuda.note(f"score {j}")
        return 10 * j

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward") as pool:
        futures = []
        for j in range(2):
            fake_cuda.note(f"generate {j}")
            futures.append(pool.submit(stream.run, stream.mark_ready(), lambda j=j: score(j)))
        assert [f.result() for f in futures] == [0, 10]
    main = [(what, current) for thread, what, current in fake_cuda.log if not thread.startswith("reward")]
    worker = [(what, current) for thread, what, current in fake_cuda.log if thread.startswith("reward")]
    # the generating thread records each event after its sub-batch, on its own (default) stream
    assert main == [
        ("generate 0", "default"),
        ("record event1", "default"),
        ("generate 1", "default"),
        ("record event2", "default"),
    ]
    # the worker waits for that event on the side stream, then scores there
    side = "side(cuda:0)"
    assert worker == [("wait event1", side), ("score 0", side), ("wait event2", side), ("score 1", side)]


@pytest.mark.parametrize("device, enabled", [("cuda", False), ("cpu", True)])
def test_off_or_on_a_cpu_the_scorer_runs_as_before(fake_cuda, device, enabled):
    stream = ScoreStream(torch.device(device), enabled=enabled)
    ready = stream.mark_ready()
    assert stream.stream is None and ready is None
    assert stream.run(ready, lambda: 7) == 7
    assert fake_cuda.log == []


def test_only_colocated_overlap_reads_score_stream():
    check_unread_knobs(load_config(None, ["system=colocated-overlap", "runtime.score_stream=false"]))
    with pytest.raises(ConfigError, match=r"runtime\.score_stream.*colocated-overlap"):
        check_unread_knobs(load_config(None, ["system=colocated-sync", "runtime.score_stream=false"]))
