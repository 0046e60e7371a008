"""Link model of the simulator: per-rank ports, point-to-point transfers, collectives, host copies.

Model (documented here because every schedule's numbers depend on it):

- Every rank has one **egress** and one **ingress** port. A point-to-point transfer of n bytes from a to
  b occupies a's egress and b's ingress for ``n / link_gbps(a, b)`` seconds, with ``link_gbps`` from the
  hardware profile (intra-node NVLink or the per-GPU network NIC, GB/s per direction;
  :meth:`HardwareProfile.link_gbps`). Transfers that share a port **serialise in request order** (FIFO
  reservation, no bandwidth sharing): the simulator processes requests in time order, so a transfer
  starts at ``max(now, egress free, ingress free)``. Serialising and fair-sharing give the same finish
  time for the last of the transfers sharing a port; FIFO makes earlier requests finish earlier, which is
  what NCCL's in-order P2P on one communicator does. Full-duplex links: a's egress and a's ingress are
  independent. Every message also pays the sender's ``CostModel.message_latency_s`` (NCCL launch and, for a
  buffered send, the c10d-store handshake that acknowledges it), a parameter of the cost model.
- A transfer does not occupy the *compute* of either rank (NCCL P2P runs on its own stream) unless a
  schedule says so (UniRL's reap runs on the rollout worker and blocks it, docs/references.md [000]).
- Collectives use ring algorithms with the nccl-tests bus-bandwidth conventions
  (github.com/NVIDIA/nccl-tests doc/PERFORMANCE.md): all-reduce moves ``2(n−1)/n · bytes`` over the
  slowest ring link, broadcast moves ``bytes`` over it (pipelined ring: every byte crosses every link
  once). The ring visits ranks in rank order, so a ring over two nodes crosses the network twice and its
  slowest link is the network.
- Host↔device copies (residency transitions, docs/design.md §2) take ``bytes / host_device_gbps``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from digenrl.runtime.hardware.profiles import HardwareProfile

GB = 1e9  # the profiles' GB/s are gigaBYTES (1e9 B) per second, per direction


class Network:
    """Port reservations over one hardware profile."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self._egress_free: dict[int, float] = defaultdict(float)
        self._ingress_free: dict[int, float] = defaultdict(float)
        self._rate: dict[tuple[int, int], float] = {}

    def bytes_per_s(self, src: int, dst: int) -> float:
        key = (src, dst)
        if key not in self._rate:
            self._rate[key] = self.profile.link_gbps(src, dst) * GB
        return self._rate[key]

    def reserve_transfer(
        self, now: float, src: int, dst: int, nbytes: float, latency_s: float = 0.0
    ) -> tuple[float, float]:
        """Book a point-to-point transfer requested at ``now``; returns its (start, end)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes == 0 or src == dst:
            return now, now
        start = max(now, self._egress_free[src], self._ingress_free[dst])
        end = start + latency_s + nbytes / self.bytes_per_s(src, dst)
        self._egress_free[src] = end
        self._ingress_free[dst] = end
        return start, end

    def reserve_group(self, now: float, ranks: Sequence[int], seconds: float) -> tuple[float, float]:
        """Book every port of ``ranks`` for one collective of ``seconds`` (starts when all are free)."""
        if seconds <= 0:
            return now, now
        start = max([now] + [max(self._egress_free[r], self._ingress_free[r]) for r in ranks])
        end = start + seconds
        for r in ranks:
            self._egress_free[r] = end
            self._ingress_free[r] = end
        return start, end

    def ring_bottleneck_bytes_per_s(self, ranks: Sequence[int]) -> float:
        ordered = sorted(set(ranks))
        if len(ordered) < 2:
            return float("inf")
        pairs = zip(ordered, ordered[1:] + ordered[:1], strict=True)
        return min(self.bytes_per_s(a, b) for a, b in pairs)

    def allreduce_s(self, ranks: Sequence[int], nbytes: float) -> float:
        """Ring all-reduce time: 2(n−1)/n · bytes over the slowest ring link (nccl-tests PERFORMANCE.md)."""
        n = len(set(ranks))
        if n < 2 or nbytes == 0:
            return 0.0
        return 2 * (n - 1) / n * nbytes / self.ring_bottleneck_bytes_per_s(ranks)

    def broadcast_s(self, ranks: Sequence[int], nbytes: float) -> float:
        """Pipelined ring broadcast: bytes over the slowest ring link (nccl-tests: busBW = algBW)."""
        if len(set(ranks)) < 2 or nbytes == 0:
            return 0.0
        return nbytes / self.ring_bottleneck_bytes_per_s(ranks)

    def host_copy_s(self, nbytes: float) -> float:
        """Host↔device copy over PCIe (residency transitions)."""
        return nbytes / (self.profile.links.host_device_gbps * GB)
