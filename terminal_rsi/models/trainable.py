"""Which leaves of a params tree train: all of them, or with LoRA adapters
(`terminal_rsi.models.lora`) only the adapters and a critic's value head.

`split_trainable(params)` gives (trainable, frozen), two trees of the params' structure with
each leaf in one of them and None in the other; gradients, optimizer state and updates are
those of the trainable part (`terminal_rsi.training.train_state`,
`terminal_rsi.training.grad_accum`), and `join` puts the two back. No dependencies inside the
package, so the train state and the models both read the rule from here.
"""

from __future__ import annotations

from typing import Any

import jax

ADAPTER_KEY = "lora"  # params key of the adapters of a module
TRAINED_WITH_ADAPTERS = ("value_head",)  # keys that train beside the adapters


def is_adapter(path) -> bool:
    return any(getattr(k, "key", None) == ADAPTER_KEY for k in path)


def has_adapters(params: Any) -> bool:
    """Whether a params tree holds LoRA adapters."""
    return any(is_adapter(p) for p, _ in jax.tree_util.tree_leaves_with_path(params))


def trainable_mask(params: Any) -> Any:
    """Bool per leaf: all True without adapters; with them only adapters and value heads."""
    if not has_adapters(params):
        return jax.tree.map(lambda _: True, params)
    return jax.tree_util.tree_map_with_path(
        lambda p, _: is_adapter(p) or any(getattr(k, "key", None) in TRAINED_WITH_ADAPTERS
                                           for k in p), params)


def split_trainable(params: Any) -> tuple[Any, Any]:
    """(trainable, frozen): two trees of params' structure, each leaf in exactly one of them
    and None in the other (`trainable_mask`). Without adapters frozen is all None."""
    mask = trainable_mask(params)
    keep = jax.tree.map(lambda m, x: x if m else None, mask, params)
    rest = jax.tree.map(lambda m, x: None if m else x, mask, params)
    return keep, rest


def join(trainable: Any, frozen: Any) -> Any:
    """The inverse of `split_trainable`."""
    return jax.tree.map(lambda t, f: f if t is None else t, trainable, frozen,
                        is_leaf=lambda x: x is None)
