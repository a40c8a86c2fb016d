"""One look for every figure: a fixed colour, marker and line style per method, one
figure-level legend of what is drawn, readable fonts, units in the axis labels.

Every figure of the examples, the paper experiments and :mod:`schedir.render` draws a
series through :func:`line` or :func:`bar` (the keyword arguments of ``ax.plot`` /
``ax.step`` / ``ax.bar`` for a label), lays its panels out with :func:`panels`, adds
:func:`legend` once and writes with :func:`save`. A label's style comes from
:data:`STYLES` (every registered solver, JAX's policies, ``auto``, ``whole_milp``, the
pipeline baselines and dynamic policies, the variants the experiments draw, the
reference lines and the schedule's op kinds), else from its known prefix (``"rotor
(tight)"``: rotor's colour and marker, dotted), else from a hash of the label
(deterministic across runs, unlike Python's ``hash``).

Units (:func:`axis_label`): overheads in % over store-all, memory in B/KiB/MiB/GiB
(:func:`schedir.render.byte_unit` picks one) or in % of the store-all peak, times in
s/ms/us. Pure Python: matplotlib is imported inside the functions that need it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from pathlib import Path

MIN_FONT = 8.0  # points: the smallest text any figure may have
LEGEND_FONT = 9.0
MAX_WIDTH = 13.0  # inches: wider figures shrink their fonts below MIN_FONT when shown
MIN_WIDTH = 6.5  # inches: room for a legend under a single panel
DPI = 120


@dataclass(frozen=True)
class Style:
    """How one label is drawn: ``color`` (hex), ``marker`` (matplotlib's code, ``""``:
    none), ``linestyle`` (``"-"``, ``"--"``, ``":"``, ``"-."``, ``""``: none) and, for
    bars, ``hatch``."""

    color: str
    marker: str = ""
    linestyle: str = "-"
    hatch: str = ""

    @property
    def box_hatch(self) -> str:
        """The hatch of this label's bars: its own, else one standing for its dashes
        (a dashed series' bars stay apart from a solid one's of the same colour)."""
        return self.hatch or {"--": "//", ":": "..", "-.": "xx"}.get(self.linestyle, "")


_BLUE, _ORANGE, _GREEN, _RED, _PURPLE = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"
_BROWN, _PINK, _GREY, _OLIVE, _CYAN = "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"
_BLACK = "#000000"
_STAGES = ("#6a3d9a", "#1f78b4", "#33a02c", "#b15928")  # ZeRO stages 0-3

# Methods first (legends list them in this order), then variants, op kinds, references.
_METHODS: dict[str, Style] = {
    # chain and graph rematerialization
    "store_all": Style(_BLACK, "s"),
    "recompute_all": Style(_GREY, "x"),
    "rotor": Style(_ORANGE, "o"),
    "block_rotor": Style(_ORANGE, "h"),
    "revolve": Style(_OLIVE, "v"),
    "chen_sqrt": Style(_GREEN, "^"),
    "dtr": Style(_PURPLE, "D"),
    "checkmate_milp": Style(_BLUE, "P"),
    "checkmate_lp": Style(_CYAN, "X"),
    # the automatic planner and JAX's policies
    "auto": Style(_RED, "*"),
    "whole_milp": Style(_BROWN, "d"),
    "checkpoint_dots": Style("#1b9e77", "<"),
    "nothing_saveable": Style("#7570b3", ">"),
    "everything_saveable": Style("#a6761d", "8"),
    # offloading
    "rotor_offload": Style("#4292c6", "s"),
    "offload_greedy": Style("#e6ab02", "<"),
    "offload_milp": Style("#666666", "P"),
    "weight_offload": Style("#a6761d", "h"),
    # pipelines: published baselines, solvers, dynamic policies
    "gpipe": Style(_BLUE, "s"),
    "1f1b": Style(_ORANGE, "^"),
    "interleaved_1f1b": Style(_GREEN, "v"),
    "zb_h1": Style(_PURPLE, "<"),
    "zb_h2": Style(_BROWN, ">"),
    "v_shape": Style(_PINK, "D"),
    "pipeline_joint": Style(_RED, "P"),
    "pipeline_joint_milp": Style(_RED, "X"),
    "pipeline_1f1b": Style(_ORANGE, "^", ":"),
    "pipeline_dp": Style(_BLUE, "o"),
    "pipeline_milp": Style(_BROWN, "s"),
    "pipeline_greedy": Style(_OLIVE, "^"),
    "master_worker_lp": Style(_GREY, "d"),
    "heft": Style(_CYAN, "h"),
    "eager": Style(_GREEN, "s", "--"),
    "dmda": Style("#e7298a", "D", "--"),
    "dmdas": Style("#7570b3", "d", "--"),
    "guided": Style(_RED, "P", "--"),
    "static": Style(_GREY, "s", "--"),
}

_VARIANTS: dict[str, Style] = {
    # auto_remat.py: the planner's parts and the graph methods on the block graph
    "auto (block DP only)": replace(_METHODS["auto"], marker="p", linestyle="--"),
    "whole_milp (equations)": _METHODS["whole_milp"],
    "dtr (block graph)": _METHODS["dtr"],
    "checkmate_milp (store_all)": _METHODS["checkmate_milp"],
    "checkmate_milp (nothing_saveable)": replace(_METHODS["checkmate_milp"], marker="X",
                                                 linestyle="--"),
    # remat_offload.py: one host link each, brighter for more bandwidth
    "rotor_offload pcie3": Style("#08519c", "v"),
    "rotor_offload pcie5": Style("#4292c6", "^"),
    "rotor_offload nvlink-c2c": Style("#6baed6", "s"),
    # auto_offload.py: the planner's joint remat + offload plans per host link (reds,
    # darker for more bandwidth) and JAX's hand offload policy
    "auto + offload pcie4": Style("#fb6a4a", "v", "--"),
    "auto + offload pcie5": Style("#de2d26", "^", "--"),
    "auto + offload nvlink-c2c": Style("#a50f15", "s", "--"),
    "checkpoint_dots + offload pcie4": Style("#1b9e77", "v", ""),
    "checkpoint_dots + offload pcie5": Style("#1b9e77", "^", ""),
    "checkpoint_dots + offload nvlink-c2c": Style("#1b9e77", "s", ""),
    # traced_pipelines.py: the blocks split evenly by hand, under the best baseline
    "hand (even cut)": Style("#525252", "s", "--"),
    # pipeline_schedules.py: every baseline with full rematerialization, dashed
    **{f"{name}+remat": replace(_METHODS[name], linestyle="--")
       for name in ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "v_shape")},
    # dynamic_training.py: 1F1B's plan in the pipeline simulator
    "1f1b_judge": Style(_ORANGE, "o", ":"),
    # zero_memory.py: our per-tensor accounting per stage, the ZeRO paper's formula over it
    **{f"ZeRO-{s}": Style(c, "o") for s, c in enumerate(_STAGES)},
    "ZeRO paper's formula": Style(_BLACK, "", "--"),
    # zero_memory.py: how activations are kept (bars); 8-bit storage hatched
    "store_all 8-bit": Style(_BLACK, "s", "-", "////"),
    "rotor 8-bit": Style(_ORANGE, "o", "-", "////"),
}  # fmt: skip

_REFERENCES: dict[str, Style] = {
    "budget": Style(_RED, "", "--"),
    "memory cap": Style(_RED, "", ":"),
    "LP bound": Style(_BLACK, "", ":"),
    "memory: op peak, then resident": Style(_BLACK, "", "-"),
    # examples/demo.py: the simulator's curves and the runtime's measurements
    "predicted op peak": Style(_BLUE, "", "-"),
    "predicted resident": Style(_ORANGE, "", "-"),
    "measured op peak": Style(_BLUE, "x", ""),
    "measured resident": Style(_ORANGE, ".", ""),
}

# The op kinds of schedule drawings (schedir.render; Span.kind): filled boxes.
OP_KINDS: dict[str, Style] = {
    "F_ck": Style("#9ecae1", "", ""),
    "F_n": Style("#c6dbef", "", ""),
    "F_all": Style("#3182bd", "", ""),
    "Loss": Style("#d62728", "", ""),
    "B": Style("#fd8d3c", "", ""),
    "forward": Style("#3182bd", "", ""),
    "recompute": Style("#9ecae1", "", ""),
    "backward": Style("#fd8d3c", "", ""),
    "weight_grad": Style("#fdd0a2", "", ""),
    "copy": Style("#31a354", "", ""),
    "other": Style("#969696", "", ""),
}

STYLES: dict[str, Style] = {**_METHODS, **_VARIANTS, **OP_KINDS, **_REFERENCES}

_FALLBACK_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
                    "#e6550d", "#31a354", "#756bb1", "#636363")  # fmt: skip
_FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")
_SEPARATORS = (" ", "+", "(", ",")


def style(label: str) -> Style:
    """The style of ``label``: its entry in :data:`STYLES`; else its longest known
    prefix followed by a space, ``+``, ``(`` or ``,`` (that method's colour and marker,
    dotted); else one drawn from a CRC of the label (the same in every run).

    >>> style("rotor") == STYLES["rotor"], style("rotor (tight)").linestyle
    (True, ':')
    >>> style("my_method") == style("my_method")
    True
    """
    if label in STYLES:
        return STYLES[label]
    bases = [k for k in _METHODS if label.startswith(k) and label[len(k)] in _SEPARATORS]
    if bases:
        base = STYLES[max(bases, key=len)]
        return Style(base.color, base.marker, ":")
    h = zlib.crc32(label.encode())
    return Style(_FALLBACK_COLORS[h % len(_FALLBACK_COLORS)],
                 _FALLBACK_MARKERS[(h // len(_FALLBACK_COLORS)) % len(_FALLBACK_MARKERS)],
                 "-.")  # fmt: skip


def line(label: str, *, stack: tuple[int, int] | None = None, **extra) -> dict:
    """Keyword arguments of ``ax.plot`` / ``ax.step`` for the series ``label``: its
    colour, marker (hollow: points that coincide stay visible) and line style.

    ``stack=(k, n)``: the k-th of n series drawn in one panel; earlier ones get wider
    lines and larger markers, so a series another one covers exactly (two exact
    methods at the same optimum) still shows around it."""
    s = style(label)
    width, size = 1.5, 6.0
    if stack is not None and stack[1] > 1:
        below = (stack[1] - 1 - stack[0]) / (stack[1] - 1)  # 1 for the first, 0 for the last
        width, size = 1.2 + 1.6 * below, 5.0 + 4.0 * below
    kw = {"label": label, "color": s.color, "marker": s.marker, "linestyle": s.linestyle,
          "markerfacecolor": "none", "markeredgewidth": 1.3, "linewidth": width,
          "markersize": size * (1.4 if s.marker == "*" else 1.0)}  # fmt: skip
    return kw | extra


def bar(label: str, **extra) -> dict:
    """Keyword arguments of ``ax.bar`` / ``ax.broken_barh`` for ``label``: its colour
    (lighter under a hatch) and :attr:`Style.box_hatch`."""
    s = style(label)
    kw = {"label": label, "facecolor": s.color, "edgecolor": "white", "linewidth": 0.5}
    if s.box_hatch:
        kw.update(facecolor=_lighter(s.color), edgecolor=s.color, hatch=s.box_hatch)
    return kw | extra


def _lighter(color: str) -> str:
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{(v + 2 * 255) // 3:02x}" for v in rgb)


# Units: the last parenthesis of every axis label with numbers on it.
UNITS = ("%", "s", "ms", "us", "B", "KiB", "MiB", "GiB", "TiB", "parameters",
         "billion parameters", "micro-batches/s", "items/s", "ops", "nodes")  # fmt: skip
OVERHEAD = "overhead vs store-all (%)"  # of the makespan (predicted or simulated)


def axis_label(quantity: str, unit: str) -> str:
    """``"quantity (unit)"``; ``unit`` is one of :data:`UNITS` or a percentage of a
    stated reference (``"% of store-all peak"``).

    >>> axis_label("memory budget", "% of store-all peak")
    'memory budget (% of store-all peak)'
    """
    if unit not in UNITS and not unit.startswith("% of "):
        raise ValueError(f"unit = {unit!r}: expected one of {', '.join(UNITS)} or '% of ...'")
    return f"{quantity} ({unit})"


def unit_of(label: str) -> str | None:
    """The unit an axis label states (its last parenthesis), or None.

    >>> unit_of("memory per device (GiB)"), unit_of("op")
    ('GiB', None)
    """
    if not label.endswith(")") or "(" not in label:
        return None
    unit = label[label.rindex("(") + 1 : -1]
    return unit if unit in UNITS or unit.startswith("% of ") else None


def panels(
    n: int,
    *,
    max_cols: int = 3,
    size: tuple[float, float] = (4.0, 3.0),
    sharey: bool = False,
):
    """A figure of ``n`` panels of about ``size`` inches (at most ``max_cols`` a row, the
    figure :data:`MIN_WIDTH` to :data:`MAX_WIDTH` inches wide) with constrained layout:
    ``(figure, [axes, ...])``. ``sharey``: one y axis for all panels, its numbers (and
    label, :func:`axis_labels`) in the first column only."""
    from matplotlib.figure import Figure

    if n < 1:
        raise ValueError(f"n = {n}: expected at least one panel")
    cols = min(n, max_cols)
    rows = -(-n // cols)
    width = min(MAX_WIDTH, max(MIN_WIDTH, size[0] * cols))
    fig = Figure(figsize=(width, size[1] * rows + 0.6), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False, sharey=sharey)
    axes = list(grid.ravel())
    for ax in axes[n:]:
        ax.remove()
    for ax in axes[:n]:
        ax.grid(alpha=0.3)
    return fig, axes[:n]


def axis_labels(ax, x: tuple[str, str], y: tuple[str, str]) -> None:
    """Label a panel's axes, each from ``(quantity, unit)`` (:func:`axis_label`); a panel
    sharing its y axis with the panel on its left (:func:`panels` with ``sharey``)
    shows no y label, as it shows no y numbers."""
    ax.set_xlabel(axis_label(*x))
    shared = len(ax.get_shared_y_axes().get_siblings(ax)) > 1
    if not shared or ax.get_subplotspec().is_first_col():
        ax.set_ylabel(axis_label(*y))


def _rank(label: str) -> tuple[int, str]:
    order = list(STYLES)
    return (order.index(label), "") if label in STYLES else (len(order), label)


def legend(fig, *, title: str | None = None):
    """The one legend of ``fig``, under its panels: every labelled series drawn in any
    panel (labels starting with ``_`` are not series), once, in :data:`STYLES`' order,
    each shown in its plain style (whatever width a ``stack`` gave it)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    drawn: dict = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            drawn.setdefault(label, handle)
    labels = sorted(drawn, key=_rank)
    handles = [Line2D([], [], **line(label)) if isinstance(drawn[label], Line2D)
               else Patch(**bar(label)) for label in labels]  # fmt: skip
    return fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=_columns(labels, fig.get_figwidth() * 72),
        fontsize=LEGEND_FONT,
        title=title,
        title_fontsize=LEGEND_FONT,
        frameon=False,
    )


def _columns(labels: list[str], width: float) -> int:
    """The most legend columns whose entries fit ``width`` points (estimated: a
    character is 0.62 em, a handle with its padding 5 em; matplotlib gives the first
    ``len % cols`` columns one entry more)."""
    for cols in range(len(labels), 1, -1):
        sizes = [len(labels) // cols + (k < len(labels) % cols) for k in range(cols)]
        starts = [sum(sizes[:k]) for k in range(cols)]
        need = sum(LEGEND_FONT * (5 + 0.62 * max(map(len, labels[a : a + n])))
                   for a, n in zip(starts, sizes, strict=True))  # fmt: skip
        if need <= 0.95 * width:
            return cols
    return 1


def save(fig, path: str | Path) -> Path:
    """Write ``fig`` (PNG, SVG or PDF by suffix) with no date or random id in the file:
    the same data gives the same bytes."""
    import matplotlib

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}}.get(path.suffix.lower())
    with matplotlib.rc_context({"svg.hashsalt": "schedir"}):
        fig.savefig(path, dpi=DPI, metadata=metadata)
    return path
