"""Per-device memory of data parallelism and ZeRO stages 1-3, and the largest GPT that fits.

Part 1 (``zero_memory.csv``): for GPT-3-shaped models and device counts, the bytes each
device holds for mixed-precision Adam training (fp16 parameters and gradients, fp32
master parameters, momentum and variance) under ZeRO stage 0 (plain data parallelism)
to 3, from our per-tensor accounting (:mod:`schedir.training_state`: tensors that no
device count divides stay replicated) next to the ZeRO paper's closed form
(Rajbhandari et al. 2020, Fig. 1: (2 + 2 + K) bytes per parameter, K = 12). The paper's
7.5B example at 64 devices is printed exactly (one flat tensor of 7.5e9 elements, as
the formula assumes; only for device counts that divide it). At large N, tensors with no
axis N divides stay whole on every device, and our figures leave the formula's.

Part 2 (``zero_fit.csv``): the largest model of a GPT shape family (hidden d = 128 k,
k layers, d / 128 heads, vocabulary 50257, 2048 tokens, one sequence per device) whose
training state plus activations fit a device of 40 or 80 GiB, for each ZeRO stage, with
the optimizer state on the device or offloaded to the host (host memory unlimited), with
activations stored (store-all) or at rotor's least budget (``solvers.solve(chain, 0,
"rotor")``'s ``Infeasible.min_budget``), and with the stored activations in 16 bits or
in 8 bits (``_8bit``: float8 or int8 with a per-tensor scale, jax_exec/auto/lowbit.py).
The activations are a MODEL, not a profile: per layer, Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", eq. 1, no tensor
parallelism) s b d (34 + 5 a s / d) bytes kept for the backward, a 2 s b d layer input,
4 s b V bytes of fp32 logits and as much for their gradient at the loss; times
proportional to the layer's FLOPs. Of the 34 s b d + 5 a s^2 b bytes, the dropout masks
(2 s b d + a s^2 b, one byte per element) stay as they are and the fp16 tensors (32 s b d
+ 4 a s^2 b) halve in 8 bits: s b d (18 + 3 a s / d) bytes; the layer inputs kept by
rematerialization stay in 16 bits (recomputation starts from them), and so do the logits.
What 8-bit storage does to the gradient is measured on real models by
``benchmarks/lowbit_activations.py``, not here. The training state's
peak adds stage 3's gathered layer and the reduce-scatter buffer of a layer's gradients
(:class:`schedir.training_state.DeviceBytes`). Writes also ``zero_memory.png`` and
``zero_memory.md``.

    python paper_experiments/zero_memory.py [--quick] [--out results/zero_memory]
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
import solvers  # noqa: E402
from schedir import plot_style  # noqa: E402
from schedir.training_state import (  # noqa: E402
    Placement,
    device_bytes,
    mixed_precision_adam,
    zero_paper_bytes,
)
from solvers.chain.store_all import store_all_ops  # noqa: E402

FIELDS = ["model", "parameters", "devices", "stage", "ours_bytes", "paper_bytes", "ours_gb",
          "paper_gb", "peak_bytes"]  # fmt: skip
FIT_FIELDS = ["device_gib", "devices", "stage", "offload", "activations", "layers", "hidden",
              "parameters", "capped", "state_bytes", "activation_bytes", "total_bytes"]  # fmt: skip
# GPT-3 (Brown et al. 2020, Table 2.1): name -> (layers, hidden)
GPT3 = {"gpt3-125M": (12, 768), "gpt3-1.3B": (24, 2048), "gpt3-6.7B": (32, 4096),
        "gpt3-13B": (40, 5120), "gpt3-175B": (96, 12288)}  # fmt: skip
VOCAB, TOKENS, BATCH = 50257, 2048, 1
PAPER_PSI, PAPER_DEVICES = 7_500_000_000, 64
GIB = 2**30


def gpt_shapes(layers: int, hidden: int) -> tuple[list, list[list[int]]]:
    """(parameter shapes, blocks): token and position embeddings, per layer two LayerNorms,
    qkv, attention output, MLP up and down (with biases), a final LayerNorm; the output
    head is tied to the token embedding. Blocks: the embeddings, each layer, the final norm."""
    d = hidden
    shapes = [(VOCAB, d), (TOKENS, d)]
    blocks = [[0, 1]]
    layer = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,),
             (4 * d, d), (d,)]  # fmt: skip
    for _ in range(layers):
        blocks.append(list(range(len(shapes), len(shapes) + len(layer))))
        shapes += layer
    blocks.append([len(shapes), len(shapes) + 1])
    shapes += [(d,), (d,)]
    return [(s, 2) for s in shapes], blocks


def count(shapes: list) -> int:
    total = 0
    for s, _ in shapes:
        n = 1
        for dim in s:
            n *= dim
        total += n
    return total


def state(shapes: list, blocks: list, devices: int, stage: int, offload: bool = False):
    params, opt = mixed_precision_adam(shapes)
    return device_bytes(params, opt, Placement.zero(stage, offload=offload), devices,
                        blocks=blocks)  # fmt: skip


def memory_rows(devices: list[int]) -> list[dict]:
    models = {"paper-7.5B": ([((PAPER_PSI,), 2)], None), **{
        name: gpt_shapes(*shape) for name, shape in GPT3.items()}}  # fmt: skip
    rows = []
    for name, (shapes, blocks) in models.items():
        psi = count(shapes)
        for n in devices:
            if blocks is None and psi % n:
                continue  # a flat tensor N does not divide stays whole: not the paper's model
            for stage in range(4):
                ours = state(shapes, blocks, n, stage)
                paper = zero_paper_bytes(psi, n, stage)
                rows.append({
                    "model": name, "parameters": psi, "devices": n, "stage": stage,
                    "ours_bytes": ours.resident, "paper_bytes": float(paper),
                    "ours_gb": round(ours.resident / 1e9, 3),
                    "paper_gb": round(float(paper) / 1e9, 3),
                    # the paper gives no layer shapes: no transient buffers to count
                    "peak_bytes": ours.peak if blocks is not None else "",
                })  # fmt: skip
    return rows


MODES = ("store_all", "rotor_min", "store_all_8bit", "rotor_min_8bit")


def layer_chain(layers: int, hidden: int, low_bit: bool = False) -> schedir.Chain:
    """The activation model of the module docstring as a rotor chain (embedding, layers);
    ``low_bit``: the kept tensors in 8 bits."""
    s, b, d, a = TOKENS, BATCH, hidden, hidden // 128
    x = 2 * s * b * d
    if low_bit:
        kept = s * b * d * 18 + 3 * a * s * s * b
    else:
        kept = s * b * d * 34 + 5 * a * s * s * b
    flops = 24 * s * b * d * d + 4 * s * s * b * d  # per layer, forward
    fwd = [1e-12 * x] + [1e-12 * flops] * layers + [0.0]
    bwd = [1e-12 * x] + [2e-12 * flops] * layers + [1e-12 * 2 * s * b * d * VOCAB]
    return schedir.Chain(
        fwd_time=tuple(fwd), bwd_time=tuple(bwd),
        in_size=(4 * s * b,) + (x,) * (layers + 1),  # int32 tokens, then fp16 activations
        saved_size=(x,) + (kept,) * layers + (0,),
        fwd_tmp=(0,) * (layers + 2), bwd_tmp=(0,) * (layers + 1) + (8 * s * b * VOCAB,),
    )  # fmt: skip


@functools.cache
def activation_bytes(k: int, mode: str) -> int:
    chain = layer_chain(k, 128 * k, low_bit=mode.endswith("_8bit"))
    if mode.startswith("store_all"):
        return schedir.simulate(chain, store_all_ops(chain)).peak_memory
    try:
        solvers.solve(chain, 0, "rotor")
    except solvers.Infeasible as err:
        return err.min_budget
    raise AssertionError("rotor fits a zero budget")


@functools.cache
def gpt(k: int) -> tuple[list, list]:
    return gpt_shapes(k, 128 * k)


def fit(budget: int, devices: int, stage: int, offload: bool, mode: str, top: int) -> dict:
    """The largest k in [1, top] whose total fits ``budget`` (memory grows with k)."""

    def total(k: int) -> tuple[int, int, int]:
        st = state(*gpt(k), devices, stage, offload).peak
        act = activation_bytes(k, mode)
        return st, act, st + act

    lo, hi = 0, top  # lo fits (0: nothing), hi + 1 does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if total(mid)[2] <= budget:
            lo = mid
        else:
            hi = mid - 1
    st, act, tot = total(lo) if lo else (0, 0, 0)
    return {"device_gib": budget // GIB, "devices": devices, "stage": stage,
            "offload": int(offload), "activations": mode, "layers": lo, "hidden": 128 * lo,
            "parameters": count(gpt(lo)[0]) if lo else 0, "capped": int(lo == top),
            "state_bytes": st,
            "activation_bytes": act, "total_bytes": tot}  # fmt: skip


ACTIVATIONS = {"store_all": "store_all", "rotor_min": "rotor",
               "store_all_8bit": "store_all 8-bit", "rotor_min_8bit": "rotor 8-bit"}  # fmt: skip


def plot(rows: list[dict], fits: list[dict]):
    """Left: the training state per device by ZeRO stage, ours and the paper's formula
    (dashed, over ours).
    Right: the largest GPT that fits, by stage and optimizer placement, for each way of
    keeping activations."""
    fig, (ax, bx) = plot_style.panels(2, size=(6.0, 4.2))
    n = max(r["devices"] for r in rows)
    for stage in range(4):
        pts = sorted((r["parameters"], r["ours_bytes"] / GIB, r["paper_bytes"] / GIB)
                     for r in rows if r["devices"] == n and r["stage"] == stage
                     and r["model"].startswith("gpt"))  # fmt: skip
        x, ours, paper = zip(*pts, strict=True)
        ax.plot(x, ours, **plot_style.line(f"ZeRO-{stage}"))
        ax.plot(x, paper, **plot_style.line("ZeRO paper's formula", linewidth=1))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(f"training state per device, {n} devices, mixed-precision Adam")
    ax.set_xlabel(plot_style.axis_label("model size", "parameters"))
    ax.set_ylabel(plot_style.axis_label("training state per device", "GiB"))
    gib, n = max(f["device_gib"] for f in fits), max(f["devices"] for f in fits)
    mine = [f for f in fits if f["device_gib"] == gib and f["devices"] == n]
    groups = list(dict.fromkeys((f["stage"], f["offload"]) for f in mine))
    width = 0.8 / len(ACTIVATIONS)
    for k, (mode, label) in enumerate(ACTIVATIONS.items()):
        size = {(f["stage"], f["offload"]): f["parameters"] / 1e9 for f in mine
                if f["activations"] == mode}  # fmt: skip
        bx.bar([g + (k - (len(ACTIVATIONS) - 1) / 2) * width for g in range(len(groups))],
               [size[g] for g in groups], width, **plot_style.bar(label))  # fmt: skip
    bx.set_xticks(range(len(groups)),
                  [f"ZeRO-{s}\n{'host' if off else 'device'}" for s, off in groups])  # fmt: skip
    bx.set_yscale("log")
    bx.set_xlabel("ZeRO stage; optimizer state on the device or the host")
    bx.set_ylabel(plot_style.axis_label("largest GPT that fits", "billion parameters"))
    bx.set_title(f"{gib} GiB devices, {n} devices (activation model)")
    bx.grid(alpha=0.3, axis="y")
    bx.grid(False, axis="x")
    plot_style.legend(fig, title="ZeRO-s: our accounting; bars: activations stored "
                      "(store_all) or at rotor's least budget, 8-bit hatched")  # fmt: skip
    return fig


def markdown(rows: list[dict], fits: list[dict]) -> str:
    lines = ["# Per-device training state (mixed-precision Adam), ours vs the ZeRO paper", "",
             "| model | parameters | devices | stage | ours (GB) | paper (GB) "
             "| ours with transients (GB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        peak = "n/a" if r["peak_bytes"] == "" else f"{r['peak_bytes'] / 1e9:.3f}"
        lines.append(f"| {r['model']} | {r['parameters']:,} | {r['devices']} | {r['stage']} "
                     f"| {r['ours_bytes'] / 1e9:.3f} | {r['paper_bytes'] / 1e9:.3f} "
                     f"| {peak} |")  # fmt: skip
    lines += ["", "# Largest GPT (d = 128 k, k layers) that fits, activation MODEL", "",
              "| device | devices | stage | optimizer | activations | layers | parameters | "
              "state (GiB) | activations (GiB) |",
              "|---|---:|---:|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for f in fits:
        lines.append(f"| {f['device_gib']} GiB | {f['devices']} | {f['stage']} | "
                     f"{'host' if f['offload'] else 'device'} | {f['activations']} | "
                     f"{f['layers']} | {'>= ' if f['capped'] else ''}{f['parameters']:,} | "
                     f"{f['state_bytes'] / GIB:.2f} | "
                     f"{f['activation_bytes'] / GIB:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes (used by the tests)")
    parser.add_argument("--out", default="results/zero_memory", help="output directory")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    paper = [zero_paper_bytes(PAPER_PSI, PAPER_DEVICES, s) for s in range(4)]
    print(f"ZeRO paper, 7.5B parameters, {PAPER_DEVICES} devices: baseline "
          f"{float(paper[0]) / 1e9:.1f} GB; stages 1/2/3: "
          + " / ".join(f"{float(p) / 1e9:.1f}" for p in paper[1:]) + " GB (exact bytes: "
          + ", ".join(str(int(p)) for p in paper) + ")")  # fmt: skip
    rows = memory_rows([1, 8, 64] if args.quick else [1, 8, 64, 256, 1024])
    ours = [r["ours_bytes"] for r in rows if r["model"] == "paper-7.5B"
            and r["devices"] == PAPER_DEVICES]  # fmt: skip
    assert ours == [int(p) for p in paper], (ours, paper)
    print("our accounting of the same example: "
          + " / ".join(f"{b / 1e9:.1f}" for b in ours) + " GB")  # fmt: skip
    fits = []
    budgets = [40 * GIB] if args.quick else [40 * GIB, 80 * GIB]
    device_counts = [64] if args.quick else [8, 64]
    top = 160 if args.quick else 320  # k = 320: 6.4T parameters
    for budget in budgets:
        for n in device_counts:
            for stage in range(4):
                for offload in (False, True):
                    for mode in MODES:
                        fits.append(fit(budget, n, stage, offload, mode, top))
                        print(f"  {budget // GIB} GiB, {n} devices, stage {stage}, offload "
                              f"{offload}, {mode}: {fits[-1]['parameters'] / 1e9:.2f}B"
                              f"{' (the search top)' if fits[-1]['capped'] else ''} "
                              f"({time.perf_counter() - start:.0f}s)", flush=True)  # fmt: skip
    write_csv(out / "zero_memory.csv", FIELDS, rows)
    write_csv(out / "zero_fit.csv", FIT_FIELDS, fits)
    (out / "zero_memory.md").write_text(markdown(rows, fits))
    plot_style.save(plot(rows, fits), out / "zero_memory.png")
    print(f"zero_memory: {len(rows)} memory rows, {len(fits)} fits in "
          f"{time.perf_counter() - start:.1f}s -> {out}")  # fmt: skip


if __name__ == "__main__":
    main()
