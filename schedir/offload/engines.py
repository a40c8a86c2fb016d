"""The copy engines' timing rule, one place for the offload simulator
(:mod:`schedir.offload.simulate`) and the block chain's host-memory variants
(:func:`schedir.blocks.simulate.simulate_blocks`): one engine per direction
(``"offload"``: device to host, ``"prefetch"``: host to device); a copy starts once it
is issued and its engine is free, so copies on one engine run one after another in
the order they are issued, and the two directions overlap each other and compute."""

from __future__ import annotations


class CopyEngines:
    """The time each engine is next free (seconds).

    >>> e = CopyEngines()
    >>> e.issue("offload", 1.0, 2.0), e.issue("offload", 1.5, 1.0), e.issue("prefetch", 0.0, 1.0)
    ((1.0, 3.0), (3.0, 4.0), (0.0, 1.0))
    """

    def __init__(self) -> None:
        self.free = {"offload": 0.0, "prefetch": 0.0}

    def issue(self, direction: str, ready: float, seconds: float) -> tuple[float, float]:
        """A copy issued at ``ready`` taking ``seconds`` on ``direction``'s engine: its
        ``(start, end)``."""
        start = max(ready, self.free[direction])
        end = start + seconds
        self.free[direction] = end
        return start, end
