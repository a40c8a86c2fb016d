"""Figures read at a glance (issue 26): schedir.plot_style's table covers every method,
the schedule drawing (schedir.render) keeps its op labels readable and apart and its
loss op visible, the docs' and examples' figures pass tests/figure_checks.py, and the
checks themselves catch what they are for.

The paper experiments' figures are checked by their own quick-mode tests
(tests/experiments), which render them anyway; the examples' quick runs are slow (here
and in tests/experiments/test_auto_scripts.py) and their plot functions are also checked
on small data in the default run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from figure_checks import check_figure, check_saved, load_script, recorded, series, texts

import schedir
import solvers
from schedir import plot_style, render

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ROOT / "examples" / "chain_small.json"
DEMO = ROOT / "examples" / "demo_model.json"


# ------------------------------------------------------------------- the style table


def method_names() -> set[str]:
    """Every name a figure may draw a method under: registered solvers, JAX's policies,
    the planner's methods, the pipeline baselines and dynamic policies."""
    from jax_exec.auto.methods import BLOCK_METHODS
    from schedir.pipeline.baselines import BASELINES
    from solvers.pipeline.dynamic import POLICIES

    return (
        {m.name for m in solvers.available()} | set(BLOCK_METHODS) | set(BASELINES) | set(POLICIES)
    )


def test_every_method_has_a_fixed_style() -> None:
    missing = sorted(method_names() - set(plot_style.STYLES))
    assert not missing, f"no entry in plot_style.STYLES for {missing}"


def test_no_two_entries_look_alike_unless_the_same_method() -> None:
    """Two labels share a look only when one is the other with a note (``dtr (block
    graph)`` is dtr), so a figure drawing both would draw the same method twice. (Op
    kinds of different problem kinds share colours on purpose: F_all is a forward.)"""
    seen: dict = {}
    for label, s in plot_style.STYLES.items():
        if label in plot_style.OP_KINDS:
            continue
        look = (s.color, s.marker, s.linestyle, s.hatch)
        if look in seen:
            first = seen[look]
            assert label.startswith(first + " ") or first.startswith(label + " "), (
                f"{first!r} and {label!r} look the same"
            )
        seen.setdefault(look, label)


def test_unknown_labels_get_a_deterministic_style() -> None:
    assert plot_style.style("rotor (tight)") == plot_style.Style(
        plot_style.STYLES["rotor"].color, plot_style.STYLES["rotor"].marker, ":"
    )
    code = "from schedir import plot_style; print(plot_style.style('my_new_method'))"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    }
    assert len(runs) == 1 and str(plot_style.style("my_new_method")) in runs.pop()


def test_axis_labels_state_a_known_unit() -> None:
    assert plot_style.axis_label("peak", "% of store-all peak") == "peak (% of store-all peak)"
    assert plot_style.unit_of(plot_style.OVERHEAD) == "%"
    with pytest.raises(ValueError, match="unit = 'furlongs'"):
        plot_style.axis_label("distance", "furlongs")
    assert plot_style.unit_of("time (fortnights)") is None


def test_legend_lists_what_is_drawn_once_in_the_table_order() -> None:
    fig, axes = plot_style.panels(3)
    axes[0].plot([0, 1], [0, 1], **plot_style.line("dtr"))
    axes[1].plot([0, 1], [1, 0], **plot_style.line("rotor"))
    axes[2].plot([0, 1], [1, 1], **plot_style.line("dtr", stack=(0, 2)))
    axes[2].plot([0, 1], [1, 1], label="_not a series")
    legend = plot_style.legend(fig)
    assert [t.get_text() for t in legend.get_texts()] == ["rotor", "dtr"]
    assert fig.get_figwidth() <= plot_style.MAX_WIDTH


def test_saving_is_deterministic(tmp_path: Path) -> None:
    chain = schedir.load(CHAIN)
    schedule = solvers.solve(chain, 1400, "rotor")
    for suffix in (".png", ".svg", ".pdf"):
        a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
        render.plot(chain, schedule, a)
        render.plot(chain, schedule, b)
        assert a.read_bytes() == b.read_bytes(), suffix


# ------------------------------------------------------------------- the checks bite


def _good_figure():
    fig, (ax,) = plot_style.panels(1)
    ax.plot([0, 1], [0, 1], **plot_style.line("rotor"))
    ax.set_xlabel(plot_style.axis_label("memory budget", "KiB"))
    ax.set_ylabel(plot_style.OVERHEAD)
    return fig, ax


def test_a_good_figure_passes() -> None:
    fig, _ = _good_figure()
    plot_style.legend(fig)
    check_figure(fig, "good")


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda fig, ax: ax.legend(), "1 figure legends|legends inside panels"),
        (lambda fig, ax: ax.plot([0, 1], [1, 1], color="red", label="dtr"), "'dtr' drawn as"),
        (lambda fig, ax: ax.plot([0], [1], **plot_style.line("my_method")), "no fixed style"),
        (lambda fig, ax: ax.set_xlabel("memory budget"), "states no unit"),
        (lambda fig, ax: ax.set_title("tiny", fontsize=5), "under 8"),
        (lambda fig, ax: ax.text(0.5, 0.5, "over") and ax.text(0.5, 0.5, "over"), "overlap"),
        (lambda fig, ax: ax.set_ylabel("overhead " * 30 + "(%)"), "runs off the figure"),
        (lambda fig, ax: fig.set_figwidth(20), "wide"),
    ],
)
def test_the_checks_catch(spoil, message: str) -> None:
    fig, ax = _good_figure()
    spoil(fig, ax)
    if not fig.legends:
        plot_style.legend(fig)
    with pytest.raises(AssertionError, match=message):
        check_figure(fig, "spoiled")


def test_a_legend_missing_a_series_is_caught() -> None:
    fig, ax = _good_figure()
    plot_style.legend(fig)
    ax.plot([0, 1], [1, 0], **plot_style.line("dtr"))  # drawn after the legend
    with pytest.raises(AssertionError, match="legend .* but drawn"):
        check_figure(fig, "late series")


# ------------------------------------------------------------------- schedule drawings


def problems() -> dict:
    chain, demo = schedir.load(CHAIN), schedir.load(DEMO)
    graph = chain.to_graph()
    offload = schedir.OffloadProblem(demo, schedir.Platform.host_offload("pcie3"))
    devices = [schedir.Device(f"g{k}") for k in range(4)]
    platform = schedir.Platform.fully_connected(devices, 25e9, 1e-5)
    pipe = schedir.PipelineProblem(demo, [0] * demo.length, platform, microbatches=8,
                                   training=True)  # fmt: skip
    return {
        "chain": (chain, solvers.solve(chain, 1400, "rotor")),
        "profiled chain": (demo, solvers.solve(demo, "140MiB", "rotor")),
        "graph": (graph, solvers.solve(graph, 1400, "checkmate_milp")),
        "offload": (offload, solvers.solve(offload, "60MiB", "rotor_offload")),
        "pipeline": (pipe, solvers.solve(pipe, None, "pipeline_1f1b")),
    }


@pytest.mark.parametrize("name", list(problems()))
def test_schedule_drawing(name: str) -> None:
    problem, schedule = problems()[name]
    fig = render.figure(problem, schedule)
    check_figure(fig, name)
    timeline = fig.axes[0]
    boxes = [path.get_extents(c.get_transform()) for c in timeline.collections
             for path in c.get_paths()]  # fmt: skip
    labels = [t for t in timeline.texts if t.get_visible()]
    assert labels, f"{name}: no op labelled"
    for text in labels:  # inside its own box (so never over another op's)
        box = text.get_window_extent()
        assert text.get_fontsize() >= plot_style.MIN_FONT
        inside = [b for b in boxes if b.x0 <= box.x0 and box.x1 <= b.x1
                  and b.y0 <= box.y0 and box.y1 <= b.y1]  # fmt: skip
        assert inside, f"{name}: label {text.get_text()!r} outside its box"
    losses = series(fig).get("Loss", [])
    assert bool(losses) == (name not in ("graph", "pipeline")), f"{name}: loss drawn {losses}"
    for collection in losses:
        widths = [p.get_extents(collection.get_transform()).width for p in collection.get_paths()]
        assert min(widths) >= render.LOSS_PX - 0.5, f"{name}: the loss op is {widths} px wide"


def test_op_labels_of_a_crowded_schedule_are_left_out_not_overlapped() -> None:
    """The 14-stage profile's 36 ops on a 10-inch figure: only labels that fit are drawn."""
    problem, schedule = problems()["profiled chain"]
    fig = render.figure(problem, schedule)
    shown = [t for t in fig.axes[0].texts]
    assert 0 < len(shown) < len(schedule)
    assert all(t in texts(fig) for t in shown)


# ------------------------------------------------------------------- docs and examples


def test_docs_figures() -> None:
    make = load_script("docs/img/make_figures.py")
    check_figure(make.cost_model_figure(schedir.load(CHAIN)), "cost_model.png")
    check_figure(make.plan_figure(), "auto_plan_gpt.png")


def test_demo_figure() -> None:
    """examples/demo.py's figure on the small chain (simulated as the runtime would
    measure it: the demo checks both agree to the byte)."""
    demo = load_script("examples/demo.py")
    chain = schedir.load(CHAIN)
    curves = []
    for label, budget in (("store-all", 1630), ("half", 1400), ("near-min", 1300)):
        trace = schedir.simulate(chain, solvers.solve(chain, budget, "rotor"))
        measured = SimpleNamespace(op_peak_bytes=trace.op_peak, resident_bytes=trace.resident)
        curves.append((label, budget, trace, measured))
    check_figure(demo.plot(curves), "memory_rotor.png")


@pytest.mark.slow
def test_demo_quick_run_figure(tmp_path: Path, monkeypatch, capsys) -> None:
    """`make demo`'s figure from a real (quick) run: measured by the runtime."""
    figures = recorded(monkeypatch)
    load_script("examples/demo.py").main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "memory_rotor.png")


def test_auto_schedule_figure() -> None:
    example = load_script("examples/auto_schedule.py")
    result = {"auto": [(40, 0.3), (70, 0.05), (100, 0.0)], "rotor": [(45, 0.25), (100, 0.0)]}
    result |= {policy: [(p, o)] for policy, p, o in (("checkpoint_dots", 60, 0.2),
               ("nothing_saveable", 42, 0.35), ("everything_saveable", 180, 0.0))}  # fmt: skip
    result |= {"whole_milp": [(50, 0.2)], "dtr": [(90, 0.4)], "checkmate_milp": [(66, 0.44)]}
    check_figure(example.plot("gpt", result, 100), "auto_schedule_gpt.png")
