"""What every figure of the repository must satisfy, checked on the matplotlib objects
(issue 26; the look is schedir.plot_style's):

- exactly one legend, the figure's, listing every labelled series drawn and nothing else;
- each series in its fixed style (colour, marker, line style, hatch) in every panel,
  every label a known one (no hashed fallback style), no two series alike;
- every axis with numbers on it states its unit (or shares the axis of one that does);
- no text under ``plot_style.MIN_FONT`` points, none off the figure, no two texts
  overlapping, the figure at most ``plot_style.MAX_WIDTH`` inches wide.

:func:`recorded` collects the figures a script saves (``Figure.savefig`` patched), so
the experiments' own quick-mode tests check the figures they render anyway;
:func:`load_script` loads a script of the repository in the test's process.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from itertools import combinations
from pathlib import Path

from schedir import plot_style

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str):
    """The module of a script of the repository (``examples/demo.py``), loaded in this
    process so that its figures can be inspected; ``sys.path`` and ``sys.modules`` are
    left as they were (the script's own path edits and the examples' ``auto_models``,
    whose name tests/auto_models.py has too, do not leak into other tests)."""
    path_before, saved = list(sys.path), sys.modules.pop("auto_models", None)
    try:
        spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path_before
        sys.modules.pop("auto_models", None)
        if saved is not None:
            sys.modules["auto_models"] = saved
    return module


def recorded(monkeypatch) -> dict[str, object]:
    """File name -> the Figure saved to it, for every figure saved from now on."""
    from matplotlib.figure import Figure

    figures: dict[str, object] = {}
    real = Figure.savefig

    def save(self, fname, *args, **kwargs):
        figures[getattr(fname, "name", str(fname)).rsplit("/", 1)[-1]] = self
        return real(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", save)
    return figures


def _rgb(color) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(round(v, 3) for v in to_rgb(color))


def _marker(m) -> str:
    return "" if m in (None, "None", "none", "", " ") else m


def _linestyle(ls) -> str:
    named = {"solid": "-", "dashed": "--", "dotted": ":", "dashdot": "-."}
    return "" if ls in (None, "None", "none", "", " ") else named.get(ls, ls)


def series(fig) -> dict[str, list]:
    """Label -> the artists drawn under it, in every panel (``_`` labels are not series)."""
    found: dict[str, list] = {}
    for ax in fig.axes:
        in_bars = {id(p) for c in ax.containers for p in c}
        artists = [*ax.lines, *ax.collections, *ax.containers,
                   *(p for p in ax.patches if id(p) not in in_bars)]  # fmt: skip
        for artist in artists:
            label = artist.get_label()
            if label and not label.startswith("_"):
                found.setdefault(label, []).append(artist)
    return found


def _look(artist, s: plot_style.Style) -> tuple:
    """What tells two series apart: a line's colour, marker and dashes; a box's colour
    and hatch."""
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        return ("line", _rgb(s.color), s.marker, s.linestyle)
    return ("box", _rgb(s.color), s.box_hatch)


def _drawn(artist) -> tuple:
    """:func:`_look` of what ``artist`` shows (a hatched box's colour is its edge's)."""
    from matplotlib.collections import Collection
    from matplotlib.container import BarContainer
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        return ("line", _rgb(artist.get_color()), _marker(artist.get_marker()),
                _linestyle(artist.get_linestyle()))  # fmt: skip
    looks = set()
    for p in list(artist) if isinstance(artist, BarContainer) else [artist]:
        hatch = p.get_hatch() or ""
        if isinstance(p, Collection):
            colors = p.get_edgecolor() if hatch else p.get_facecolor()
        else:
            colors = [p.get_edgecolor() if hatch else p.get_facecolor()]
        looks |= {("box", _rgb(c), hatch) for c in colors}
    assert len(looks) == 1, f"{artist.get_label()}: parts drawn differently: {looks}"
    return looks.pop()


def check_styles(fig, name: str) -> None:
    """One legend, the figure's, with exactly the series drawn, each in its style."""
    assert len(fig.legends) == 1, f"{name}: {len(fig.legends)} figure legends"
    panels = [ax.get_title() or str(i) for i, ax in enumerate(fig.axes) if ax.get_legend()]
    assert not panels, f"{name}: legends inside panels {panels}"
    drawn = series(fig)
    listed = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(listed) == len(set(listed)), f"{name}: legend lists twice: {listed}"
    assert set(listed) == set(drawn), f"{name}: legend {sorted(listed)} but drawn {sorted(drawn)}"
    unknown = sorted(label for label in drawn if label not in plot_style.STYLES)
    assert not unknown, f"{name}: labels with no fixed style in plot_style.STYLES: {unknown}"
    looks = {}
    for label, artists in drawn.items():
        for artist in artists:
            want = _look(artist, plot_style.STYLES[label])
            got = _drawn(artist)
            assert got == want, f"{name}: {label!r} drawn as {got}, its style is {want}"
            looks.setdefault(label, want)
    for a, b in combinations(sorted(looks), 2):
        assert looks[a] != looks[b], f"{name}: {a!r} and {b!r} look the same"


def _numeric(axis) -> bool:
    """Whether the axis shows numbers (not categories such as device names)."""
    shown = [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    return any(NUMBER.fullmatch(text) for text in shown)


NUMBER = re.compile(r"[$]?(\\mathdefault\{)?[-−+]?[\d.,]+(e[-+]?\d+|\^\{[-−]?\d+\})?\}?[$]?")


def check_units(fig, name: str) -> None:
    """Every axis with numbers states its unit, or shares the axis of one that does."""
    for ax in fig.axes:
        for which, axis, shared in (("x", ax.xaxis, ax.get_shared_x_axes()),
                                    ("y", ax.yaxis, ax.get_shared_y_axes())):  # fmt: skip
            if not axis.get_visible() or not _numeric(axis):
                continue
            labels = [axis.get_label_text()] + [
                getattr(s, f"get_{which}label")() for s in shared.get_siblings(ax)
            ]
            assert any(plot_style.unit_of(label) for label in labels), (
                f"{name}, panel {ax.get_title()!r}: {which} axis label {labels[0]!r} "
                f"states no unit of {plot_style.UNITS} or '% of ...'"
            )


def texts(fig) -> list:
    """The visible, non-empty texts of ``fig`` (tick labels in their axes' view only)."""
    from matplotlib.text import Text

    hidden = set()
    for ax in fig.axes:
        for axis, view in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(view), max(view)
            slack = 1e-9 * (hi - lo)
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                if not lo - slack <= tick.get_loc() <= hi + slack:
                    hidden |= {id(tick.label1), id(tick.label2)}
    return [t for t in fig.findobj(Text)
            if t.get_visible() and t.get_text() and id(t) not in hidden]  # fmt: skip


def check_text(fig, name: str) -> None:
    """Width at most MAX_WIDTH, every text at least MIN_FONT points, inside the figure,
    no two overlapping."""
    assert fig.get_figwidth() <= plot_style.MAX_WIDTH + 1e-9, (
        f"{name}: {fig.get_figwidth():.1f} in wide (at most {plot_style.MAX_WIDTH})"
    )
    fig.draw_without_rendering()
    shown = texts(fig)
    small = sorted({(t.get_text()[:30], t.get_fontsize()) for t in shown
                    if t.get_fontsize() < plot_style.MIN_FONT})  # fmt: skip
    assert not small, f"{name}: text under {plot_style.MIN_FONT} pt: {small[:5]}"
    boxes = [(t.get_text(), t.get_window_extent()) for t in shown]
    frame = fig.bbox
    for text, box in boxes:
        inside = box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1
        assert inside and box.y0 >= frame.y0 - 1 and box.y1 <= frame.y1 + 1, (
            f"{name}: text {text!r} runs off the figure"
        )
    for (a, box_a), (b, box_b) in combinations(boxes, 2):
        dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        assert dx <= 1 or dy <= 1, f"{name}: texts {a!r} and {b!r} overlap"


def check_figure(fig, name: str = "figure") -> None:
    """Every rule of the module docstring."""
    check_styles(fig, name)
    check_units(fig, name)
    check_text(fig, name)


def check_saved(figures: dict, *names: str) -> None:
    """Exactly the figures ``names`` were saved (:func:`recorded`), and each passes."""
    assert sorted(figures) == sorted(names), f"saved {sorted(figures)}, expected {names}"
    for name, fig in figures.items():
        check_figure(fig, name)
