"""A zoo of tiny Flax NNX models, each written the way public Flax NNX implementations of a
well-known architecture are written (a config dataclass held by the module, dropout and
BatchNorm in training mode, RNG streams held by modules, ...), to test the automatic planner
(``jax_exec.plan``, ``jax_exec.value_and_grad``) against plain ``nnx.value_and_grad``.

Each family module ``<name>.py`` has ``make(seed=0) -> Case``; ``FAMILIES`` maps every family
name to its ``make`` and ``case(name)`` builds one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    """One model of the zoo.

    ``factory()`` builds the same model (same parameters, same RNG state) on every call;
    ``loss_fn(model, *args) -> loss``; ``aux_loss_fn(model, *args) -> (loss, metrics)`` with
    ``metrics["loss"] == loss``; ``args``: deterministic arrays; ``notes``: what it exercises.
    """

    name: str
    factory: Callable[[], Any]
    loss_fn: Callable[..., Any]
    aux_loss_fn: Callable[..., Any]
    args: tuple
    notes: str = ""


# The family modules import Case from here, so they are imported after it.
from . import (  # noqa: E402
    audio,
    bert,
    convnext,
    decoder_lm,
    dino,
    efficientnet,
    gnn,
    lstm,
    mixer,
    resnet,
    scan_lm,
    ssm,
    t5,
    unet,
    vae,
    vit,
)

FAMILIES: dict[str, Callable[[], Case]] = {
    "decoder_lm": decoder_lm.make,
    "ssm": ssm.make,
    "vit": vit.make,
    "dino": dino.make,
    "convnext": convnext.make,
    "efficientnet": efficientnet.make,
    "resnet": resnet.make,
    "vae": vae.make,
    "unet": unet.make,
    "t5": t5.make,
    "audio": audio.make,
    "scan_lm": scan_lm.make,
    "bert": bert.make,
    "mixer": mixer.make,
    "gnn": gnn.make,
    "lstm": lstm.make,
}


def case(name: str) -> Case:
    """The zoo's case ``name`` (a key of ``FAMILIES``)."""
    if name not in FAMILIES:
        raise KeyError(f"no zoo family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]()


__all__ = ["FAMILIES", "Case", "case"]
