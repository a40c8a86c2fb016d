"""Render a schedule: a timeline of ops per resource with the memory curve under it.

Two renderings of the same data:

- :func:`text`: a compact terminal picture (one row of op letters per resource, a few
  rows of memory bars under it, a legend);
- :func:`plot`: a PNG or SVG figure (matplotlib, imported inside the function only).

Both read :func:`lanes`: a map resource -> list of :class:`Span` (start, end, label,
kind), from the ``lanes`` function of the problem's kind (:mod:`schedir.kind`), and
:func:`memory_curve`, from the kind's ``memory`` function. A multi-resource kind
returns one entry per resource (offload: ``compute``, ``d2h``, ``h2d``; pipeline: one
per device and per link) and both renderings draw one row per resource. Pure Python:
importing this module never imports matplotlib.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from schedir import kind as kinds
from schedir.chain.schedule import Schedule
from schedir.simulate import simulate
from schedir.trace import Span, Trace

# kind -> (one-letter code for the terminal, matplotlib color)
KINDS: dict[str, tuple[str, str]] = {
    "F_ck": ("c", "#9ecae1"),
    "F_n": ("n", "#c6dbef"),
    "F_all": ("A", "#3182bd"),
    "Loss": ("L", "#d62728"),
    "B": ("B", "#fd8d3c"),
    "forward": ("F", "#3182bd"),
    "recompute": ("r", "#9ecae1"),
    "backward": ("B", "#fd8d3c"),
    "weight_grad": ("W", "#fdd0a2"),
    "copy": ("o", "#31a354"),
    "other": ("?", "#969696"),
}

LanesFn = Callable[[object, Schedule, Trace], dict[str, list[Span]]]


def _kind(problem):
    kind = kinds.of(problem)
    if kind is None:
        raise TypeError(f"no problem kind reads a {type(problem).__name__} (schedir.kind)")
    return kind


def lanes(problem, schedule: Schedule, trace: Trace | None = None) -> dict[str, list[Span]]:
    """Resource -> spans of ``schedule`` on ``problem`` (simulated when ``trace`` is None)."""
    trace = trace if trace is not None else simulate(problem, schedule)
    return _kind(problem).lanes(problem, schedule, trace)


def memory(problem, trace) -> tuple[list[float], list[int]]:
    """The memory curve drawn under the lanes: the kind's ``memory`` function, else
    :func:`memory_curve`."""
    curve = _kind(problem).memory or memory_curve
    return curve(trace)


def memory_curve(trace: Trace) -> tuple[list[float], list[int]]:
    """Piecewise-constant memory over time: (times, bytes), for a step plot (``where='post'``).

    During op i the memory is its ``op_peak``; right after it, ``resident``.
    """
    times, values = [0.0], [trace.initial_memory]
    for s, e, peak, res in zip(trace.start, trace.end, trace.op_peak, trace.resident, strict=True):
        times += [s, e]
        values += [peak, res]
    return times, values


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``; below 1 KiB, plain bytes.

    >>> format_bytes(1000), format_bytes(3 * 2**30)
    ('1000 B', '3.00 GiB')
    """
    if isinstance(n, int) and abs(n) >= 2**40 * 10**6:  # beyond a float's reach: Decimal
        return f"{Decimal(n) / 2**40:.3e} TiB"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def byte_unit(largest: float) -> tuple[int, str]:
    """(bytes per unit, name) for an axis whose largest value is ``largest`` bytes.

    >>> byte_unit(3 * 2**20), byte_unit(100)
    ((1048576, 'MiB'), (1, 'B'))
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(largest) >= size:
            return size, unit
    return 1, "B"


def time_unit(largest: float) -> tuple[float, str]:
    """(seconds per unit, name) for an axis whose largest value is ``largest`` seconds.

    >>> time_unit(0.25), time_unit(12.0)
    ((0.001, 'ms'), (1.0, 's'))
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(largest) >= scale:
            return scale, unit
    return 1e-6, "us"


def format_time(t: float) -> str:
    """Seconds with a readable unit: ``0.0123`` -> ``'12.3 ms'``.

    >>> format_time(2.5), format_time(0.0123), format_time(4e-6)
    ('2.5 s', '12.3 ms', '4 us')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= scale or unit == "us":
            return f"{t / scale:.3g} {unit}"
    return f"{t} s"  # pragma: no cover


_BARS = " ▁▂▃▄▅▆▇█"


def text(
    problem,
    schedule: Schedule,
    *,
    width: int = 80,
    height: int = 4,
    budget: int | None = None,
    trace: Trace | None = None,
) -> str:
    """A terminal rendering: op letters per resource over time, memory bars under them.

    Each column is ``makespan / width`` seconds; a lane shows the letter of the op
    running longest in that column. Memory rows show the peak of each column scaled to
    the largest peak (``height`` rows of block characters).

    >>> import schedir, solvers
    >>> chain = schedir.load("examples/chain_small.json")
    >>> print(text(chain, solvers.solve(chain, 1400, "rotor"), width=40).splitlines()[0])
    rotor, 15 ops: makespan 25 s, peak 1.30 KiB (budget 1.37 KiB)
    """
    if width < 1 or height < 1:
        raise ValueError(f"width = {width}, height = {height}: expected at least 1 column and row")
    trace = trace if trace is not None else simulate(problem, schedule)
    by_lane = lanes(problem, schedule, trace)
    span = trace.makespan or 1.0
    dt = span / width
    name = schedule.meta.get("method", type(schedule).__name__)
    budget = budget if budget is not None else schedule.meta.get("budget")
    head = (
        f"{name}, {len(schedule)} ops: makespan {format_time(trace.makespan)}, "
        f"peak {format_bytes(trace.peak_memory)}"
    )
    if budget is not None:
        head += f" (budget {format_bytes(budget)})"
    times, values = memory(problem, trace)
    top = max(max(values), budget or 0, 1)
    label_w = max(len(tag) for tag in [*by_lane, "memory", format_bytes(top)])
    lines = [head]
    for lane, spans in by_lane.items():
        cells = []
        for c in range(width):
            lo, hi = c * dt, (c + 1) * dt
            best, best_len = " ", 0.0
            for sp in spans:
                overlap = min(hi, sp.end) - max(lo, sp.start)
                if overlap > best_len:
                    best, best_len = KINDS.get(sp.kind, KINDS["other"])[0], overlap
            cells.append(best)
        lines.append(f"{lane:>{label_w}} |{''.join(cells)}|")
    cols = [0] * width
    for (t0, t1), v in zip(zip(times, times[1:] + [times[-1]], strict=True), values, strict=True):
        first = min(int(t0 / dt), width - 1)
        last = min(max(int((t1 - 1e-12 * span) / dt), first), width - 1)
        for c in range(first, last + 1):
            cols[c] = max(cols[c], v)
    levels = [v / top * height * 8 for v in cols]
    for row in range(height - 1, -1, -1):
        chars = "".join(_BARS[max(0, min(8, round(lv - row * 8)))] for lv in levels)
        tag = format_bytes(top) if row == height - 1 else ("memory" if row == 0 else "")
        lines.append(f"{tag:>{label_w}} |{chars}|")
    lines.append(f"{'':>{label_w}}  0{format_time(trace.makespan):>{width}}")
    used = sorted({sp.kind for spans in by_lane.values() for sp in spans})
    legend = ", ".join(f"{KINDS.get(k, KINDS['other'])[0]}={k}" for k in used)
    lines.append(f"{'':>{label_w}}  {legend}")
    return "\n".join(lines)


def plot(
    problem,
    schedule: Schedule,
    path: str | Path,
    *,
    budget: int | None = None,
    title: str | None = None,
    trace: Trace | None = None,
) -> Path:
    """Write a PNG or SVG (by ``path``'s suffix): op timeline per resource, memory under it."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"{path}: unknown image type {path.suffix!r} (use .png or .svg)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    trace = trace if trace is not None else simulate(problem, schedule)
    by_lane = lanes(problem, schedule, trace)
    budget = budget if budget is not None else schedule.meta.get("budget")
    n = len(by_lane)
    fig, (ax_t, ax_m) = plt.subplots(
        2,
        1,
        figsize=(10, 1.2 + 0.6 * n + 2.6),
        sharex=True,
        gridspec_kw={"height_ratios": [0.6 * n + 0.4, 2.6]},
    )
    used: dict[str, str] = {}
    tscale, tunit = time_unit(trace.makespan)
    for row, spans in enumerate(by_lane.values()):
        for sp in spans:
            color = KINDS.get(sp.kind, KINDS["other"])[1]
            used[sp.kind] = color
            ax_t.broken_barh(
                [(sp.start / tscale, (sp.end - sp.start) / tscale)],
                (row - 0.4, 0.8),
                facecolors=color,
                edgecolors="white",
                linewidth=0.3,
            )
            if len(spans) <= 40 and sp.end > sp.start:
                ax_t.text(
                    (sp.start + sp.end) / 2 / tscale,
                    row,
                    sp.label,
                    ha="center",
                    va="center",
                    fontsize=5,
                    rotation=90,
                    clip_on=True,
                )
    ax_t.set_yticks(range(n), list(by_lane))
    ax_t.set_ylim(n - 0.5, -0.5)
    ax_t.legend(
        handles=[Patch(color=c, label=k) for k, c in used.items()],
        fontsize=7,
        ncol=len(used),
        loc="lower left",
        bbox_to_anchor=(0, 1),
    )
    times, values = memory(problem, trace)
    scale, unit = byte_unit(max(values))
    times = [t / tscale for t in times]
    ax_m.step(
        times,
        [v / scale for v in values],
        where="post",
        color="black",
        lw=1,
        label="memory (op peak while running, resident after)",
    )
    ax_m.fill_between(times, [v / scale for v in values], step="post", alpha=0.15, color="k")
    if budget is not None:
        ax_m.axhline(budget / scale, color="#d62728", ls="--", lw=1, label="budget")
    ax_m.set_ylabel(f"memory ({unit})")
    ax_m.set_xlabel(f"time ({tunit})")
    ax_m.set_ylim(bottom=0)
    ax_m.legend(fontsize=7, loc="upper right")
    name = schedule.meta.get("method", type(schedule).__name__)
    ax_t.set_title(
        title
        or f"{name}: makespan {format_time(trace.makespan)}, "
        f"peak {format_bytes(trace.peak_memory)}",
        fontsize=10,
        pad=22,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
