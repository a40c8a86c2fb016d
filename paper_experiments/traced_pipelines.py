"""Pipelines of traced Flax models, cut and scheduled automatically, against the best
hand baseline (docs/pipelines.md, "Any Flax model").

For a traced transformer (``examples/auto_models.py``'s GPT, 8 layers, dropout off:
micro-batching needs a model whose state the call does not change) and a traced CNN
(its U-Net) on 4 and 8 devices, identical or heterogeneous (half the devices at half
speed, as a pipeline over two GPU generations), ``jax_exec.parallel.plan_pipeline``
with ``schedule="auto"`` (the balanced cut of the block chain by device speed, within
each device's memory, and the schedule of shortest simulated step that fits among
GPipe, 1F1B, ZB-H1, ZB-H2 and the joint planner's search, each with per-stage
activation plans) against the best hand baseline: the blocks split evenly
over the devices (what one does by hand: the same number of layers per device) under
the best of those schedules. Equal memory per device: every device gets the hand
baseline's largest device peak, and the automatic plan is made within it.

Every figure is predicted: roofline block times of the planner's cost model (a
data-center GPU), the pipeline simulator's step, links of 100 GB/s, peaks without the
kernels' temporaries (``working_sets=False``: lower bounds). The plans' execution on
CPU devices (loss and gradients equal plain ``nnx.value_and_grad``, bytes equal the
model after every op) is tested in tests/jax_exec/test_traced_pipeline*.py.

Writes ``traced_pipelines.csv``, ``traced_pipelines.md`` and ``traced_pipelines.png``.

    python paper_experiments/traced_pipelines.py [--quick] [--out DIR] [--models gpt unet]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import jax  # noqa: E402
from auto_models import GPT, UNet, _denoise, _token_loss  # noqa: E402
from flax import nnx  # noqa: E402

from jax_exec.parallel import plan_pipeline  # noqa: E402
from schedir import Device, Platform, plot_style  # noqa: E402
from schedir_cli.common import make_folder  # noqa: E402

ONE_CHUNK = ("1f1b", "zb_h1", "zb_h2", "gpipe")
BANDWIDTH = 100e9
FIELDS = ["model", "devices", "platform", "method", "schedule", "cuts", "makespan",
          "throughput", "bubble", "max_peak", "memory"]  # fmt: skip


def models(quick: bool) -> dict:
    """name -> (factory, loss_fn, args), batch 16."""
    vocab, dim, heads, context = (128, 32, 2, 32) if quick else (512, 128, 4, 128)
    tokens = jax.random.randint(jax.random.key(42), (16, context + 1), 0, vocab)
    width, depth, size = (4, 2, 16) if quick else (16, 3, 64)
    clean = jax.random.normal(jax.random.key(5), (16, size, size, 1))
    noisy = clean + 0.1 * jax.random.normal(jax.random.key(6), clean.shape)
    return {
        "gpt": (lambda: GPT(vocab, dim, heads, 8, context, 0.0, nnx.Rngs(params=0, dropout=1)),
                _token_loss, (tokens[:, :-1], tokens[:, 1:])),
        "unet": (lambda: UNet(width, depth, nnx.Rngs(0)), _denoise, (noisy, clean)),
    }  # fmt: skip


def platform(kind: str, n: int, memory: int | None = None) -> Platform:
    """``n`` devices of ``memory`` bytes each: ``"identical"``, or ``"mixed"``: the
    second half at half speed."""
    speeds = [1.0 if kind == "identical" or k < n // 2 else 0.5 for k in range(n)]
    devices = [Device(f"d{k}", speed=v, memory=memory) for k, v in enumerate(speeds)]
    return Platform.fully_connected(devices, BANDWIDTH)


def _schedule_name(p) -> str:
    """The schedule, and for the joint planner's the pattern it chose."""
    if p.schedule_name == "joint":
        return f"joint ({p.schedule.meta['pattern']})"
    return p.schedule_name


def row(name, n, kind, method, p, microbatches, memory) -> dict:
    return {
        "model": name, "devices": n, "platform": kind, "method": method,
        "schedule": _schedule_name(p), "cuts": " ".join(map(str, p.cuts)),
        "makespan": p.predicted.makespan,
        "throughput": microbatches / p.predicted.makespan,
        "bubble": p.predicted.bubble, "max_peak": max(p.predicted.device_peak.values()),
        "memory": memory,
    }  # fmt: skip


def run_case(name: str, make, n: int, kind: str, microbatches: int) -> list[dict]:
    """The hand baseline, then ``"auto"`` under the hand baseline's largest device peak
    as every device's memory (the same memory per device for both)."""
    factory, loss_fn, args = make
    model = factory()
    devices = jax.devices()[:1] * n  # planning only: the device objects are not used
    first = plan_pipeline(loss_fn, model, *args, devices=devices, microbatches=microbatches,
                          platform=platform(kind, n))  # fmt: skip
    L = first.model.length
    even = tuple(round(k * L / n) for k in range(n + 1))
    hand = plan_pipeline(loss_fn, model, *args, devices=devices, microbatches=microbatches,
                         platform=platform(kind, n), cuts=even)  # fmt: skip
    hands = [hand, *(hand.with_schedule(s) for s in ONE_CHUNK[1:])]
    best_hand = min(hands, key=lambda p: p.predicted.makespan)
    memory = max(best_hand.predicted.device_peak.values())
    auto = plan_pipeline(loss_fn, model, *args, devices=devices, microbatches=microbatches,
                         platform=platform(kind, n, memory), schedule="auto")  # fmt: skip
    return [row(name, n, kind, "auto", auto, microbatches, memory),
            row(name, n, kind, "hand (even cut)", best_hand, microbatches, memory)]  # fmt: skip


def summary(rows: list[dict]) -> str:
    lines = [
        "| model | devices | platform | plan | schedule | cuts | throughput (micro-batches/s) "
        "| bubble | largest device peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['devices']} | {r['platform']} | {r['method']} | "
            f"{r['schedule']} | {r['cuts']} | {r['throughput']:,.0f} | {100 * r['bubble']:.0f}% "
            f"| {r['max_peak'] / 2**20:.1f} MiB |"
        )
    pairs = {}
    for r in rows:
        pairs.setdefault((r["model"], r["devices"], r["platform"]), {})[r["method"]] = r
    lines.append("")
    for (model, n, kind), two in pairs.items():
        gain = two["auto"]["throughput"] / two["hand (even cut)"]["throughput"]
        lines.append(f"- {model}, {n} {kind} devices: auto {gain:.2f}x the hand baseline's "
                     f"throughput")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(rows: list[dict]):
    """Throughput of each plan, one panel per model, a group of bars per setting."""
    names = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plot_style.panels(len(names), max_cols=2, size=(5.0, 3.4))
    for ax, name in zip(axes, names, strict=True):
        mine = [r for r in rows if r["model"] == name]
        settings = list(dict.fromkeys((r["devices"], r["platform"]) for r in mine))
        for j, method in enumerate(("auto", "hand (even cut)")):
            xs = [k + (j - 0.5) * 0.38 for k in range(len(settings))]
            ys = [next(r["throughput"] for r in mine
                       if (r["devices"], r["platform"]) == s and r["method"] == method)
                  for s in settings]  # fmt: skip
            ax.bar(xs, ys, width=0.38, **plot_style.bar(method))
        ax.set_xticks(range(len(settings)), [f"{n} {kind}" for n, kind in settings])
        ax.set_title(f"{name} (predicted)")
        ax.set_xlabel("devices: identical, or half at half speed (mixed)")
        ax.set_ylabel(plot_style.axis_label("throughput", "micro-batches/s"))
    plot_style.legend(fig)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, 4 devices")
    parser.add_argument("--out", default="results/traced_pipelines", help="output directory")
    parser.add_argument("--models", nargs="*", default=["gpt", "unet"], choices=["gpt", "unet"])
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    make_folder(out)  # says on stderr when it creates it
    rows = []
    for name, make in models(ns.quick).items():
        if name not in ns.models:
            continue
        start = time.perf_counter()
        for n in (4,) if ns.quick else (4, 8):
            for kind in ("identical", "mixed"):
                rows += run_case(name, make, n, kind, microbatches=2 * n)
        print(f"traced_pipelines: {name} done in {time.perf_counter() - start:.1f} s", flush=True)
    with open(out / "traced_pipelines.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = summary(rows)
    (out / "traced_pipelines.md").write_text(text)
    plot_style.save(plot(rows), out / "traced_pipelines.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
