"""Random chains for solver tests (a seeded generator and hypothesis strategies).

Every generator mixes regimes, so that no solver is only tested where the usual
inequalities hold:

- ``usual``: saved_size[k] >= in_size[k+1] (abar holds a), small temporaries;
- ``small_abar``: for about half of the stages saved_size[k] < in_size[k+1] (abar
  smaller than a) where in_size[k+1] > 0, the usual relation for the others;
- ``zeros``: about half of the sizes and times are 0, saved_size independent of in_size;
- ``big_tmp``: temporaries up to four times the largest activation;
- ``loss``: a loss stage with its own fwd_time, saved_size and fwd_tmp (the
  simulator charges none of the two sizes to ``Loss``).
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from schedir import Chain

REGIMES = ("usual", "small_abar", "zeros", "big_tmp", "loss")


def _build(L: int, regime: str, size, tmp, time) -> Chain:
    """A chain of ``regime`` drawing values from size(), tmp(), time() (callables)."""
    zero = regime == "zeros"

    def maybe_zero(value):
        return 0 if zero and size() % 2 == 0 else value

    x = [maybe_zero(size()) for _ in range(L + 1)]
    if regime in ("usual", "loss"):
        saved = [x[k + 1] + size() for k in range(L)]
    elif regime == "small_abar":  # about every other stage: less than a's size (if any)
        saved = [
            max(0, min(size(), x[k + 1] - 1)) if size() % 2 else x[k + 1] + size() for k in range(L)
        ]
    else:
        saved = [maybe_zero(size()) for _ in range(L)]
    scale = 4 if regime == "big_tmp" else 1
    ftmp = [maybe_zero(tmp() * scale) for _ in range(L)]
    btmp = [maybe_zero(tmp() * scale) for _ in range(L + 1)]
    fw = [maybe_zero(time()) for _ in range(L)]
    bw = [maybe_zero(time()) for _ in range(L + 1)]
    loss = (time(), size(), tmp()) if regime == "loss" else (0.0, 0, 0)
    return Chain(
        fwd_time=[*fw, loss[0]],
        bwd_time=bw,
        in_size=x,
        saved_size=[*saved, loss[1]],
        fwd_tmp=[*ftmp, loss[2]],
        bwd_tmp=btmp,
    )


def random_chain(
    rng: random.Random,
    L: int,
    *,
    max_size: int = 10,
    max_tmp: int = 4,
    regime: str | None = None,
) -> Chain:
    """A chain with integer sizes and integral times, of ``regime`` (random if None)."""
    regime = regime or rng.choice(REGIMES)
    return _build(
        L,
        regime,
        lambda: rng.randint(0, max_size),
        lambda: rng.randint(0, max_tmp),
        lambda: float(rng.randint(0, 5)) if regime == "zeros" else float(rng.randint(1, 5)),
    )


@st.composite
def chains(draw, max_length: int = 8, max_size: int = 20, max_tmp: int = 8) -> Chain:
    L = draw(st.integers(1, max_length))
    regime = draw(st.sampled_from(REGIMES))
    return _build(
        L,
        regime,
        lambda: draw(st.integers(0, max_size)),
        lambda: draw(st.integers(0, max_tmp)),
        lambda: draw(st.floats(0.0, 10.0, allow_nan=False)),
    )


def homogeneous_chain(L: int, size: int = 4) -> Chain:
    return Chain.from_rotor(
        [1.0] * L, [1.0] * (L + 1), [size] * (L + 1), [0] + [2 * size] * L, [0] * L, [0] * (L + 1)
    )
