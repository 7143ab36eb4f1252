"""Actor and critic train states: separate pytrees, each with its own optax chain.

A `TrainState` holds `step`, `params` (pure dict, see `nnx.to_pure_dict`) and `opt_state`
as pytree children; the model `graphdef` and the optax transformation are static. Updates
are `step(state, batch) -> (state, metrics)`, jitted with the state donated
(`make_update_step(loss_fn)`), and generic over `loss_fn(params, graphdef, batch) ->
(loss, aux)`; the PPO / SFT losses plug in here. Two small losses (`lm_loss`,
`value_regression_loss`) serve tests and benchmarks.

The optimizer (paper §2.4 / DESIGN.md): global-norm gradient clipping, then AdamW with
(β1, β2, ε), decoupled weight decay on matrices only (not norms, biases or the value head
bias), constant learning rate after an optional linear warm-up.

Params holding LoRA adapters (`terminal_rsi.models.lora`) train only the adapters (and a
critic's value head): gradients are taken, and optimizer state kept, for that part alone
(`split_trainable`); the frozen weights pass through every step unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from terminal_rsi.models.trainable import join, split_trainable
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.settings import Section, SettingError, setting


@dataclasses.dataclass(frozen=True)
class Optimizer(Section):
    """One AdamW optimizer with global-norm clipping: a stage config's optimizer section
    (`rpr.config.PhaseConfig.actor_opt`, ...). The optax chain is built from
    `OptimizerConfig`, this section plus what a stage derives in code."""

    learning_rate: float = setting(1e-4, "learning rate", lo=0.0)
    b1: float = setting(0.9, "Adam β1 (paper: 0.9)", lo=0.0, hi=1.0)
    b2: float = setting(0.98, "Adam β2 (paper: 0.98)", lo=0.0, hi=1.0)
    weight_decay: float = setting(0.1, "AdamW weight decay on matrices (paper: 0.1)", lo=0.0)
    grad_clip: float | None = setting(1.0, "global-norm gradient clip (None: off)", lo=0.0)
    warmup_steps: int = setting(0, "linear lr warm-up over the first N updates of the stage "
                                "(0: the full rate from the first; a fresh Adam's first "
                                "update moves every weight by ~lr)", lo=0)


@dataclasses.dataclass(frozen=True)
class DecayingOptimizer(Optimizer):
    """An optimizer whose learning rate may decay after the warm-up (cosine)."""

    end_lr_ratio: float = setting(0.1, "cosine: final lr / peak lr", lo=0.0, hi=1.0)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(DecayingOptimizer):
    """One optax chain: a config's optimizer section (`Optimizer`, or `DecayingOptimizer`
    with its end_lr_ratio) plus what only code sets. Defaults follow the paper's RPR
    settings (β=(0.9, 0.98), wd 0.1, grad clip 1.0); a stage's section becomes one through
    `OptimizerConfig.from_config(section, **overrides)`."""

    eps: float = setting(1e-8, "Adam ε", lo=0.0)
    decay_steps: int = setting(0, "cosine decay from learning_rate to learning_rate x "
                               "end_lr_ratio, reached at this step (counted from 0, warm-up "
                               "included; more than warmup_steps); 0: constant after the "
                               "warm-up", lo=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise SettingError(f"OptimizerConfig.decay_steps = {self.decay_steps} must exceed "
                               f"warmup_steps = {self.warmup_steps} (or be 0: no decay)")


def _decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(grad_clip) -> AdamW(lr, b1, b2, eps, wd on matrices); lr: linear
    warm-up over `warmup_steps`, then constant, or with `decay_steps` a cosine decay to
    `learning_rate * end_lr_ratio` at step `decay_steps` (`lr_schedule`)."""
    lr = lr_schedule(config)
    parts = []
    if config.grad_clip is not None:
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    parts.append(optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.eps,
                             weight_decay=config.weight_decay, mask=_decay_mask))
    return optax.chain(*parts)


def lr_schedule(config: OptimizerConfig) -> Any:
    """The learning rate (a float, or an optax schedule of the step) of `make_optimizer`."""
    peak, warm, decay = config.learning_rate, config.warmup_steps, config.decay_steps
    if decay:
        return optax.warmup_cosine_decay_schedule(0.0 if warm else peak, peak, warm, decay,
                                                  end_value=peak * config.end_lr_ratio)
    if warm:
        return optax.linear_schedule(0.0, peak, warm)
    return peak


class TrainState(struct.PyTreeNode):
    """step [] int32, params (pure dict), opt_state; graphdef and tx are static."""

    step: jax.Array
    params: Any
    opt_state: Any
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)

    def model(self) -> nnx.Module:
        """The NNX module view of the current params (for eval / sampling)."""
        return nnx.merge(self.graphdef, self.params)


def create_train_state(model_cls: Callable, model_config, opt_config: OptimizerConfig,
                       mesh: Mesh | None = None, *, seed: int = 0, params: Any = None,
                       rules: Mapping | None = None) -> TrainState:
    """A sharded TrainState for `model_cls(model_config)` (DecoderLM or ValueModel).

    Parameters are initialized from `seed` inside jit with out_shardings (never unsharded),
    unless `params` (a pure dict, e.g. loaded weights or `critic_params_from_actor`) is
    given, in which case it is resharded onto the mesh. Optimizer state is sharded like the
    parameters; step and counters are replicated. `mesh` defaults to all devices on fsdp.
    """
    mesh = mesh if mesh is not None else shd.make_mesh()
    rules = rules or shd.DEFAULT_RULES
    tx = make_optimizer(opt_config)
    graphdef, abstract = shd.abstract_model(model_cls, model_config)
    p_sh = shd.param_shardings(model_cls, model_config, mesh, rules)
    if params is None:
        _, params = shd.init_params(model_cls, model_config, mesh, seed, rules)
    else:
        params = multihost.put(params, p_sh)  # also weights loaded whole on each process
    trainable = split_trainable(params)[0]
    o_sh = shd.opt_state_shardings(tx, split_trainable(nnx.to_pure_dict(abstract))[0],
                                   split_trainable(p_sh)[0], mesh)
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(trainable)
    step = jax.device_put(jnp.zeros((), jnp.int32), shd.replicated(mesh))
    return TrainState(step=step, params=params, opt_state=opt_state, graphdef=graphdef, tx=tx)


LossFn = Callable[[Any, nnx.GraphDef, Mapping[str, jax.Array]], tuple[jax.Array, dict]]


def make_update_step(loss_fn: LossFn, state: TrainState | None = None, donate: bool = True):
    """Jitted `step(state, batch) -> (state, metrics)` for `loss_fn(params, graphdef, batch)`.

    One gradient step: value_and_grad, the state's optax chain, apply. Metrics: loss,
    grad_norm (before clipping), the loss function's aux dict. The state is donated. Pass
    `state` to pin output shardings to the state's current shardings (recommended on a mesh).
    """

    def step(st: TrainState, batch):
        trainable, frozen = split_trainable(st.params)
        (loss, aux), grads = jax.value_and_grad(
            lambda t: loss_fn(join(t, frozen), st.graphdef, batch), has_aux=True)(trainable)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
        return apply_gradients(st, grads), metrics

    kwargs = {"donate_argnums": (0,) if donate else ()}
    if state is not None:
        state_sh = jax.tree.map(lambda x: x.sharding, state)
        mesh = state.step.sharding.mesh
        kwargs["out_shardings"] = (state_sh, shd.replicated(mesh))
    return jax.jit(step, **kwargs)


def apply_gradients(state: TrainState, grads) -> TrainState:
    """One step of the state's optax chain with `grads` (of the trainable part of the params,
    `split_trainable`); the step counter advances by one."""
    trainable, frozen = split_trainable(state.params)
    updates, opt_state = state.tx.update(grads, state.opt_state, trainable)
    params = join(optax.apply_updates(trainable, updates), frozen)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


def init_opt_state(tx: optax.GradientTransformation, params) -> Any:
    """`tx.init` of the trainable part of `params` (all of them without LoRA adapters). Its
    counters are put on the params' mesh (replicated) where the params have one, not left on
    this process's first device, which a multi-process update step could not take with the
    params."""
    trainable = split_trainable(params)[0]
    opt_state = tx.init(trainable)
    sharding = jax.tree.leaves(trainable)[0].sharding
    if not isinstance(sharding, NamedSharding):
        return opt_state
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    return jax.tree.map(lambda x: x if x.sharding.device_set == sharding.device_set
                        else multihost.put(x, replicated), opt_state)


# ----------------------------------------------------------------------------- test losses


def lm_loss(params, graphdef, batch) -> tuple[jax.Array, dict]:
    """Masked token NLL, mean over masked tokens.

    batch: tokens, positions, segment_ids, targets, loss_mask — all [B, L].
    """
    chex.assert_equal_shape([batch["tokens"], batch["targets"], batch["loss_mask"]])
    model = nnx.merge(graphdef, params)
    logits, _ = model(batch["tokens"], batch["positions"], batch["segment_ids"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
    mask = batch["loss_mask"].astype(jnp.float32)
    loss = jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"tokens": jnp.sum(mask)}


def value_regression_loss(params, graphdef, batch) -> tuple[jax.Array, dict]:
    """0.5 · mean over masked tokens of (V(s_t) - R_t)².

    batch: tokens, positions, segment_ids, returns (float), loss_mask — all [B, L].
    """
    chex.assert_equal_shape([batch["tokens"], batch["returns"], batch["loss_mask"]])
    model = nnx.merge(graphdef, params)
    values = model(batch["tokens"], batch["positions"], batch["segment_ids"])
    mask = batch["loss_mask"].astype(jnp.float32)
    err = (values - batch["returns"]) ** 2
    loss = 0.5 * jnp.sum(err * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"value_mean": jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)}
