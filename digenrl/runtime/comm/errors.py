"""Errors raised by the runtime layer.

Every wait in DigenRL has a timeout (docs/design.md §2, "Timeouts": when it expires, the error names the
rank that waited and what it waited for). These exception types carry that message, and let callers tell
"a peer is slow or dead" (timeout) from "a peer told us why it died" (failure report).
"""

from __future__ import annotations


class DistributedTimeoutError(RuntimeError):
    """A rank waited longer than its timeout for a peer, a key or a barrier.

    The message always names the waiting rank, its role, what it waited for and the timeout.
    """


class PeerFailureError(RuntimeError):
    """A peer published a failure report (``ControlPlane.report_failure``) while this rank was waiting.

    Raised instead of waiting out the full timeout, so a crash on one rank surfaces on its peers within a
    poll interval, with the crashing rank's own reason.
    """

    def __init__(self, message: str, *, failed_rank: int, failed_role: str, reason: str) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.failed_role = failed_role
        self.reason = reason
