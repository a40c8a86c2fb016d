"""Random chains for solver tests (hypothesis strategies and a seeded generator)."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from schedir import Chain


def random_chain(rng: random.Random, L: int, *, max_size: int = 10, max_tmp: int = 4) -> Chain:
    """A chain with integer times and sizes; saved_size[k] >= in_size[k+1] (abar holds a)."""
    x = [rng.randint(0, max_size) for _ in range(L + 1)]
    return Chain.from_rotor(
        fw=[float(rng.randint(1, 5)) for _ in range(L)],
        bw=[float(rng.randint(1, 8)) for _ in range(L + 1)],
        cw=x,
        cbw=[0] + [x[k + 1] + rng.randint(0, max_size) for k in range(L)],
        ftmp=[rng.randint(0, max_tmp) for _ in range(L)],
        btmp=[rng.randint(0, max_tmp) for _ in range(L + 1)],
    )


@st.composite
def chains(draw, max_length: int = 8, max_size: int = 20, max_tmp: int = 8) -> Chain:
    L = draw(st.integers(1, max_length))
    size = st.integers(0, max_size)
    x = [draw(size) for _ in range(L + 1)]
    time = st.floats(0.0, 10.0, allow_nan=False)
    return Chain.from_rotor(
        fw=[draw(time) for _ in range(L)],
        bw=[draw(time) for _ in range(L + 1)],
        cw=x,
        cbw=[0] + [x[k + 1] + draw(size) for k in range(L)],
        ftmp=[draw(st.integers(0, max_tmp)) for _ in range(L)],
        btmp=[draw(st.integers(0, max_tmp)) for _ in range(L + 1)],
    )


def homogeneous_chain(L: int, size: int = 4) -> Chain:
    return Chain.from_rotor(
        [1.0] * L, [1.0] * (L + 1), [size] * (L + 1), [0] + [2 * size] * L, [0] * L, [0] * (L + 1)
    )
