"""Render a schedule: a timeline of ops per resource with the memory curve under it.

Two renderings of the same data:

- :func:`text`: a compact terminal picture (one row of op letters per resource, a few
  rows of memory bars under it, a legend);
- :func:`figure`: a matplotlib figure in :mod:`schedir.plot_style`'s look, and
  :func:`plot`, which writes it as a PNG, SVG or PDF (matplotlib is imported inside
  these functions only).

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
from schedir import plot_style
from schedir.chain.schedule import Schedule
from schedir.simulate import simulate
from schedir.trace import Span, Trace

# op kind -> its letter in the terminal (colours: schedir.plot_style.OP_KINDS)
LETTERS: dict[str, str] = {
    "F_ck": "c",
    "F_n": "n",
    "F_all": "A",
    "Loss": "L",
    "B": "B",
    "forward": "F",
    "recompute": "r",
    "backward": "B",
    "weight_grad": "W",
    "copy": "o",
    "other": "?",
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
                    best, best_len = LETTERS.get(sp.kind, LETTERS["other"]), overlap
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
    legend = ", ".join(f"{LETTERS.get(k, LETTERS['other'])}={k}" for k in used)
    lines.append(f"{'':>{label_w}}  {legend}")
    return "\n".join(lines)


def figure(
    problem,
    schedule: Schedule,
    *,
    budget: int | None = None,
    title: str | None = None,
    trace: Trace | None = None,
):
    """A matplotlib ``Figure``: op timeline per resource, memory under it, one legend.

    Op boxes take their kind's colour (:data:`schedir.plot_style.OP_KINDS`); a box's
    label is drawn at 8 pt where it fits inside the box (turned upright if only that
    fits), else left out, so labels never overlap. Every box is at least a pixel wide;
    the loss op, often a sliver of the step, at least ``LOSS_PX`` pixels, with a marker
    above its lane.
    """
    from matplotlib.figure import Figure

    trace = trace if trace is not None else simulate(problem, schedule)
    by_lane = lanes(problem, schedule, trace)
    budget = budget if budget is not None else schedule.meta.get("budget")
    n = len(by_lane)
    fig = Figure(figsize=(10, 0.45 * n + 3.6), layout="constrained")
    ax_t, ax_m = fig.subplots(2, 1, sharex=True, height_ratios=[0.45 * n + 0.2, 2.4])
    tscale, tunit = time_unit(trace.makespan)
    span = (trace.makespan or 1.0) / tscale
    ax_t.set_xlim(-0.01 * span, 1.01 * span)
    px = span * 1.02 / (fig.get_figwidth() * plot_style.DPI * 0.85)  # data units per pixel
    boxes = []  # (row, start, width, label) in the time unit
    for row, spans in enumerate(by_lane.values()):
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for sp in spans:
            kind = sp.kind if sp.kind in plot_style.OP_KINDS else "other"
            start, width = sp.start / tscale, (sp.end - sp.start) / tscale
            width = max(width, (LOSS_PX if kind == "Loss" else 1) * px)  # never invisible
            if kind == "Loss":
                start = min(start, span - width)
                ax_t.plot([start + width / 2], [row - 0.5], marker="v", markersize=7,
                          color=plot_style.OP_KINDS["Loss"].color, linestyle="",
                          label="_loss marker", clip_on=False)  # fmt: skip
            by_kind.setdefault(kind, []).append((start, width))
            if sp.end > sp.start and sp.label:
                boxes.append((row, start, width, sp.label))
        for kind, xs in by_kind.items():
            ax_t.broken_barh(xs, (row - 0.4, 0.8), **plot_style.bar(kind))
    ax_t.set_yticks(range(n), list(by_lane))
    ax_t.set_ylim(n - 0.5, -0.5)
    times, values = memory(problem, trace)
    top = max(max(values), budget or 0, 1)
    scale, unit = byte_unit(top)
    times = [t / tscale for t in times]
    ys = [v / scale for v in values]
    curve = plot_style.line("memory: op peak, then resident", linewidth=1)
    ax_m.step(times, ys, where="post", **curve)
    ax_m.fill_between(times, ys, step="post", alpha=0.15, color="k", label="_memory area")
    if budget is not None:
        ax_m.axhline(budget / scale, **plot_style.line("budget", linewidth=1))
    ax_m.set_ylabel(plot_style.axis_label("memory", unit))
    ax_m.set_xlabel(plot_style.axis_label("time", tunit))
    ax_m.set_ylim(0, 1.08 * top / scale)
    ax_m.grid(alpha=0.3)
    name = schedule.meta.get("method", type(schedule).__name__)
    fig.suptitle(
        title
        or f"{name}: makespan {format_time(trace.makespan)}, peak {format_bytes(trace.peak_memory)}"
    )
    plot_style.legend(fig)
    _label_boxes(fig, ax_t, boxes)
    return fig


LOSS_PX = 4  # the least width of the loss op's box, pixels


def _label_boxes(fig, ax, boxes: list[tuple[int, float, float, str]]) -> None:
    """Write each box's label inside it where it fits (flat, else upright), else not at all."""
    fig.draw_without_rendering()  # the layout: where the boxes land in pixels
    to_px = ax.transData.transform
    drawn = []
    for row, start, width, label in boxes:
        (x0, y0), (x1, y1) = to_px([(start, row + 0.4), (start + width, row - 0.4)])
        if x1 - x0 < plot_style.MIN_FONT * 1.2:  # not even one upright line of text
            continue
        text = ax.text(start + width / 2, row, label, ha="center", va="center",
                       fontsize=plot_style.MIN_FONT, clip_on=True)  # fmt: skip
        text.set_in_layout(False)
        for rotation in (0, 90):
            text.set_rotation(rotation)
            box = text.get_window_extent()
            inside = box.x0 >= x0 + 1 and box.x1 <= x1 - 1 and box.y0 >= y0 and box.y1 <= y1
            if inside and not any(box.overlaps(other) for other in drawn):
                drawn.append(box)
                break
        else:
            text.remove()


def plot(
    problem,
    schedule: Schedule,
    path: str | Path,
    *,
    budget: int | None = None,
    title: str | None = None,
    trace: Trace | None = None,
) -> Path:
    """Write :func:`figure` as a PNG, SVG or PDF (by ``path``'s suffix)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"{path}: unknown image type {path.suffix!r} (use .png or .svg)")
    return plot_style.save(figure(problem, schedule, budget=budget, title=title, trace=trace), path)
