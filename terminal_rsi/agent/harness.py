"""The harness: a policy becomes a terminal agent (paper §3.1, §2.3, Appendix A).

    harness = HarnessConfig(max_turns=8)
    traj = run_episode(task, policy, sandbox_factory, harness)   # -> Trajectory

One episode: start the task's sandbox (seeded workspace), render the prompt (system
instructions + hints + the public instruction) with the tokenizer's chat template, then
turn by turn: the policy samples a reply (token-in/token-out: sampled ids are appended to
the context as sampled, never re-tokenized), the reply is parsed as an action in the
harness's format (`action_format`: Terminus JSON, Terminus XML or a fenced bash block,
`terminal_rsi.agent.formats`), its commands run in the sandbox, and the capped
observation is appended as an observation message (linear history). The episode ends when
the agent declares completion or a budget is hit; the protected verifier then runs
(`terminal_rsi.tasks.verify`) and its report is recorded (`Trajectory.report`, S, P, N). The
harness does not score: the stage that owns the frozen divisors applies its reward
(`terminal_rsi.rewards.scoring.EpisodeScorer`, e.g. through `RolloutScheduler(scorer=...)`).

Budgets: `max_output_tokens` per turn, `max_input_tokens` per call (a prompt that would
exceed it ends the episode with `context_overflow`, as does the sampler reaching the
model's context), `max_turns`, and a wall-clock timeout (`agent_timeout_s`, default the
task's). When the context passes `summarize_threshold` tokens, a summarizer (the policy
itself, or `HarnessConfig.summarizer`, a callable history-text -> summary) compresses the
history; the next turn starts a new segment whose prompt is rendered afresh from the summary
(`Trajectory.segments`). Summarization is never terminal.

A `Policy` is anything with `generate(requests) -> outputs`: `SamplerPolicy` (the
jitted KV-cache sampler), `ScriptedPolicy` (fixed texts, for tests) and `ReferencePolicy`
(emits the task's reference solution as actions in the harness's format).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.agent.actions import (
    Action,
    ActionParseError,
    Command,
    RejectedCommand,
    cap_text,
    format_observation,
)
from terminal_rsi.agent.formats import SHORT_SYSTEM_PROMPT, get_format
from terminal_rsi.agent.trajectory import Segment, TerminalReason, Trajectory, Turn
from terminal_rsi.config.sections import BACKEND_ALLOWED, NucleusHarness, sandbox_backend_problem
from terminal_rsi.sandbox import BadRequest, SandboxError, SandboxSpec
from terminal_rsi.sandbox.terminal import SessionOutput, session_keystrokes
from terminal_rsi.settings import setting
from terminal_rsi.tasks.spec import SESSION_SOLUTION_WAIT_S, TERMINAL_TAG, EnvironmentUnavailable
from terminal_rsi.tasks.verify import VerifierError, open_task_sandbox, seed_files
from terminal_rsi.tasks.verify import verify as verify_task

DEFAULT_SYSTEM_PROMPT = get_format("json").system_prompt("exec")
SESSION_SYSTEM_PROMPT = get_format("json").system_prompt("session")

SUMMARY_REQUEST = (
    "Summarize the work so far for a fresh context: what the task needs, what you ran, what "
    "you found, and what remains. Reply with the summary only."
)


class EpisodeCancelled(RuntimeError):
    """The scheduler cancelled this episode (a straggler after the batch filled)."""


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclasses.dataclass(frozen=True)
class HarnessConfig(NucleusHarness):
    """A harness variant (RSR's complementary harnesses are such variants): the config's
    harness section (`sections.Harness`: budgets, temperature, system prompt, action format,
    terminal, verify mode; `sections.NucleusHarness`: top-p) plus what only code sets,
    each declared once with its default, allowed values and doc.

    Defaults are the paper's harness (8192 tokens per turn, 96000 per call, summarization
    at 32000 context tokens) with 32 turns: what a library user of `HarnessConfig()` gets;
    the laptop-sized configs and the pipeline's scales set their own budgets.

    Notes on the inherited settings: the episode ends with `parse_errors` (verified and
    rewarded like max_turns) at `max_parse_errors` unparseable replies; None (the paper's
    harness): the agent gets the parse error as its observation and continues until the
    turn budget. A small model that emits one malformed reply rarely recovers (tiny default:
    3 of 217 RPR episodes had any parseable reply after a parse error, none succeeded), and
    each error observation costs ~480 tokens of rollout and update compute
    (docs/pipeline.md). `terminal` "session" has Terminus semantics
    (`terminal_rsi.sandbox.terminal`): keystrokes are typed literally (a trailing newline runs
    them, a key name such as C-c is pressed), the observation is the terminal's new output, a
    command still running at its timeout keeps running and the agent is told so; the session
    and all it started end when the episode does (after verification). `verify_mode`
    "shared" or "separate" overrides the task's own mode (`terminal_rsi.tasks.verify`),
    except that a task tagged "terminal" is always verified "shared": a fresh sandbox cannot
    see what its checks look at. The default system prompt (None, "" or
    `DEFAULT_SYSTEM_PROMPT`) follows the action format and terminal mode; each trajectory
    records the action format (`meta["action_format"]`).
    """

    name: str = setting("json-linear", "the variant's name, recorded in each trajectory")
    hints: tuple[str, ...] = setting((), "hints appended to the system prompt as a list")
    top_k: int = setting(0, "sample from the k most likely tokens (0: off)", lo=0)
    summarizer: Callable[[str], str] | None = setting(
        None, "callable(history_text) -> summary text (None: the policy summarizes)")
    max_summary_tokens: int = setting(1024, "max tokens of a summary", lo=1)
    max_command_timeout_s: float = setting(120.0, "cap on any command's timeout", lo=0.0)
    observation_role: str = setting("observation", "chat role of observation messages")
    verify_backend: str = setting("local", "backend of the verifier sandbox (a stage sets "
                                  "its tasks.backend)", check=sandbox_backend_problem,
                                  allowed=BACKEND_ALLOWED)
    private_guidance: str = setting(
        "", "text appended to the first prompt of every segment as a separate user message "
        "after the public task (RSR fresh execution, `terminal_rsi.rsr.guidance`; '': none); "
        "with guidance, each trajectory also records the public prompt of every segment "
        "(rendered without it) in meta['public_prompt_ids'], so "
        "`terminal_rsi.rsr.guidance.public_view` can remove it")

    @property
    def sampling(self) -> SamplingSettings:
        """The sampling settings of this harness's generation requests."""
        return SamplingSettings(self.temperature, self.top_p, self.top_k)

    @property
    def system_text(self) -> str:
        """The system prompt: the configured one; the default prompt (None, "" or
        DEFAULT_SYSTEM_PROMPT) or the one-line SHORT_SYSTEM_PROMPT (both written for JSON in a
        fresh shell) become their versions in the harness's action format and terminal mode."""
        fmt = get_format(self.action_format)
        if not self.system_prompt or self.system_prompt == DEFAULT_SYSTEM_PROMPT:
            return fmt.system_prompt(self.terminal)
        if self.system_prompt == SHORT_SYSTEM_PROMPT:
            return fmt.short_prompt(self.terminal)
        return self.system_prompt

    def parse(self, text: str) -> Action:
        """The action of a reply in this harness's format (ActionParseError if none)."""
        return get_format(self.action_format).parse(text, self.terminal)

    def verifier_mode(self, task) -> str:
        """Where `task` is verified after an episode (see `verify_mode`)."""
        if self.verify_mode is None or TERMINAL_TAG in task.metadata.tags:
            return task.verifier.mode
        return self.verify_mode


# ----------------------------------------------------------------------------- policies


@dataclasses.dataclass
class GenerationRequest:
    """One row of a policy call. `task`, `turn` and `purpose` ("action" or "summary") are
    context for scripted policies; model policies use only the token fields and `stream`:
    the episode's random stream (None: the policy's running key; an int, or a tuple of ints
    such as (namespace, index)). A `SamplerPolicy` samples a request with a stream from a key
    of (its seed, stream, turn, purpose) alone, so the same episode replays the same
    randomness whatever else is in flight (`StreamedPolicy`)."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingSettings = SamplingSettings()
    task: Any = None
    turn: int = 0
    purpose: str = "action"
    stream: int | tuple[int, ...] | None = None


@dataclasses.dataclass
class GenerationOutput:
    token_ids: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop_token", "stop_string", "length", "context"
    policy_version: int = 0


class Policy(Protocol):
    tokenizer: Any

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]: ...


class SamplerPolicy:
    """A policy backed by `terminal_rsi.models.sampling.Sampler` (token ids + sampling logprobs).

    Requests with equal (max_new_tokens, sampling) are generated as one batch. `set_params`
    swaps the weights between calls (async rollouts) and bumps `version`.
    """

    def __init__(self, sampler, params, tokenizer, *, seed: int = 0, version: int = 0):
        self.sampler = sampler
        self.tokenizer = tokenizer
        self._params = params
        self._serving = sampler.serving_params(params)  # LoRA merged once, not per call
        self.version = version
        self._key = jax.random.key(seed)
        self._stream_key = jax.random.key(seed)  # requests with a stream: never advanced
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()  # one sampler call at a time (not thread-safe)

    @property
    def params(self):
        return self._params

    def set_params(self, params, version: int) -> None:
        serving = self.sampler.serving_params(params)
        with self._lock:
            self._params, self._serving, self.version = params, serving, int(version)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        outs: list[GenerationOutput | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_new_tokens, r.sampling), []).append(i)
        for (max_new, s), idx in groups.items():
            with self._lock:
                self._key, key = jax.random.split(self._key)
                params, version = self._serving, self.version
            if any(requests[i].stream is not None for i in idx):
                key = self._row_keys([requests[i] for i in idx], key)
            with self._sample_lock:
                res = self.sampler.sample(
                    params, [requests[i].prompt_ids for i in idx], key,
                    max_new_tokens=max_new, temperature=s.temperature, top_p=s.top_p,
                    top_k=s.top_k, stop_token_ids=tuple(self.tokenizer.stop_ids))
            for i, o in zip(idx, res, strict=True):
                outs[i] = GenerationOutput([int(t) for t in o.token_ids],
                                           [float(x) for x in np.asarray(o.logprobs)],
                                           o.stop_reason.value, version)
        return outs  # type: ignore[return-value]

    def _row_keys(self, requests: Sequence[GenerationRequest], key) -> jax.Array:
        """One key per request: from (seed, stream, turn, purpose) where it has a stream,
        else fold_in(the call's key, row)."""
        keys = []
        for i, r in enumerate(requests):
            if r.stream is None:
                keys.append(jax.random.fold_in(key, i))
                continue
            k = self._stream_key
            for part in r.stream if isinstance(r.stream, tuple) else (r.stream,):
                k = jax.random.fold_in(k, int(part))
            k = jax.random.fold_in(k, int(r.turn))
            keys.append(jax.random.fold_in(k, int(r.purpose == "summary")))
        return jnp.stack(keys)


class StreamedPolicy:
    """`policy` with every request tagged with one episode's random stream (`stream`): with
    a `SamplerPolicy` underneath, the episode's sampling depends only on the policy's seed,
    the stream and its own tokens (common random numbers: the same actor on the same stream
    replays the same episode; two actors on it differ only where they differ)."""

    def __init__(self, policy, stream: int | tuple[int, ...]):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.stream = tuple(int(x) for x in stream) if isinstance(stream, tuple) else int(stream)

    @property
    def version(self) -> int:
        return getattr(self.policy, "version", 0)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        return self.policy.generate([dataclasses.replace(r, stream=self.stream)
                                     for r in requests])


class ScriptedPolicy:
    """Replies with `script(request) -> text`, encoded and closed with the stop token;
    log-probabilities are 0 (a deterministic policy). Respects max_new_tokens."""

    def __init__(self, tokenizer, script: Callable[[GenerationRequest], str], version: int = 0):
        self.tokenizer = tokenizer
        self.script = script
        self.version = version
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        self.calls += 1
        out = []
        for r in requests:
            ids = list(self.tokenizer.encode(self.script(r))) + [self.tokenizer.stop_ids[0]]
            reason = "stop_token"
            if len(ids) > r.max_new_tokens:
                ids, reason = ids[:r.max_new_tokens], "length"
            out.append(GenerationOutput(ids, [0.0] * len(ids), reason, self.version))
        return out


def reference_step(task, turn: int, terminal: str = "exec") -> Action:
    """The task's reference solution turn `turn` as an `Action` (the last one declares
    completion; past the end: an empty completing action). For a `terminal` "session"
    harness each command is typed and run (`session_keystrokes`), waiting up to
    `SESSION_SOLUTION_WAIT_S`."""
    sol = task.solution
    steps = sol[turn] if turn < len(sol) else ()
    if terminal == "session":
        wait = float(min(task.agent_timeout_s, SESSION_SOLUTION_WAIT_S))
        cmds = tuple(Command(session_keystrokes(c), wait) for c in steps)
    else:
        cmds = tuple(Command(c, float(min(task.agent_timeout_s, 120.0))) for c in steps)
    return Action(f"reference step {turn + 1} of {len(sol)}", cmds,
                  task_complete=turn >= len(sol) - 1)


def reference_action(task, turn: int, terminal: str = "exec", action_format: str = "json",
                     compact: bool = False) -> str:
    """`reference_step` written in `action_format` (`compact`: without the free text and
    default fields, `ActionFormat.render`)."""
    return get_format(action_format).render(reference_step(task, turn, terminal), terminal,
                                            compact)


class ReferencePolicy(ScriptedPolicy):
    """Emits the reference solution of `request.task` as actions (tests: S = 1 through the
    whole harness), typed for `terminal` ("exec" or "session", the harness's mode) and
    written in `action_format`. Summaries are a fixed sentence."""

    def __init__(self, tokenizer, version: int = 0, terminal: str = "exec",
                 action_format: str = "json"):
        def script(r: GenerationRequest) -> str:
            if r.purpose == "summary":
                return "Summary: following the reference steps."
            return reference_action(r.task, r.turn, terminal, action_format)

        super().__init__(tokenizer, script, version)


# ----------------------------------------------------------------------------- episode


def safe_decode(tokenizer, ids: Sequence[int]) -> str:
    """Decode for parsing/display; ids the tokenizer cannot decode (a model vocabulary padded
    past the tokenizer's) become U+FFFD instead of failing the episode."""
    try:
        return tokenizer.decode(ids, skip_special=True)
    except ValueError:
        size = getattr(tokenizer, "vocab_size", None)
        parts, run = [], []
        for i in ids:
            if size is not None and not 0 <= int(i) < size:
                parts.append(tokenizer.decode(run, skip_special=True) + "\ufffd")
                run = []
            else:
                run.append(int(i))
        return "".join(parts) + tokenizer.decode(run, skip_special=True)


def _render(tokenizer, messages) -> list[int]:
    return [int(i) for i in tokenizer.render(messages, add_generation_prompt=True)]


# Conversations a continuation is cut from: a system message first (so the template adds no
# default one, as SmolLM2's and Qwen's templates do before a conversation without one), then
# an assistant reply ending at a stop token, as a sampled reply does.
_SYSTEM_USER = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
_WITH_REPLY = (*_SYSTEM_USER, {"role": "assistant", "content": "a"})


def _suffix_after(tokenizer, anchor, message, cut) -> list[int] | None:
    """The tokens the template adds for `message` after `anchor`, from position `cut(prefix)`
    of the anchor's own rendering; None when the anchor does not render as a prefix there."""
    prefix = [int(i) for i in tokenizer.render(list(anchor), add_generation_prompt=False)]
    full = _render(tokenizer, [*anchor, message])
    at = cut(prefix)
    if at is None or full[:at] != prefix[:at]:
        return None
    return full[at:]


def continuation_ids(tokenizer, role: str, text: str, last_sampled: Sequence[int]) -> list[int]:
    """Tokens appended after the sampled ids: (the end-of-message token if the reply was cut
    by length) + what the chat template writes between a reply's stop token and the next
    message (ChatML's newline) + the rendered message + the next generation prompt.

    Cut from the template's rendering of a whole conversation, so it holds exactly what the
    template adds for one more message. Rendering the message alone lets a template open a
    new conversation there: SmolLM2's put its default system prompt ("You are a helpful AI
    assistant named SmolLM") before every observation. Templates that render a final
    assistant message differently from an earlier one (Qwen3's thinking block) are cut after
    the user message instead, without the separator."""
    message = {"role": role, "content": text}
    stops = set(int(i) for i in tokenizer.stop_ids)

    def after_last_stop(prefix):
        at = [i for i, t in enumerate(prefix) if t in stops]
        return at[-1] + 1 if at else None

    ids = _suffix_after(tokenizer, _WITH_REPLY, message, after_last_stop)
    if ids is None:
        ids = _suffix_after(tokenizer, _SYSTEM_USER, message, len)
    if ids is None:
        raise ValueError("the chat template does not render a conversation as a prefix of the "
                         "same conversation with one more message; a multi-turn episode "
                         "needs that to append an observation")
    if not last_sampled or int(last_sampled[-1]) not in stops:
        ids = [int(tokenizer.stop_ids[0])] + ids
    return ids


def _initial_messages(task, harness: HarnessConfig, summary: str | None = None):
    system = harness.system_text
    if harness.hints:
        system += "\n\nHints:\n" + "\n".join(f"- {h}" for h in harness.hints)
    user = f"Task:\n{task.instruction}"
    if summary is not None:
        user += f"\n\nSummary of your progress so far (earlier context was summarized):\n{summary}"
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    if harness.private_guidance:
        msgs.append({"role": "user", "content": harness.private_guidance})
    return msgs


def _record_public_prompt(tok, task, harness, traj, segment: int, summary=None) -> None:
    """With private guidance: store the segment's prompt rendered without it (P(τ̃))."""
    if harness.private_guidance:
        public = _render(tok, _initial_messages(
            task, dataclasses.replace(harness, private_guidance=""), summary))
        traj.meta.setdefault("public_prompt_ids", {})[str(segment)] = public


def default_sandbox_factory(task):
    return open_task_sandbox(task, "local")


def pool_sandbox_factory(pool, timeout: float | None = None):
    """A sandbox factory drawing from a `terminal_rsi.sandbox.pool.SandboxPool` (local and
    remote endpoints): the task's workspace is seeded and its setup commands run, as
    `open_task_sandbox` does for local backends. Tasks that need their own image
    (`environment.image`, a Dockerfile or a compose file) raise EnvironmentUnavailable:
    open those with `open_task_sandbox(task, "docker")` instead."""

    def factory(task):
        env = task.environment
        if env.image or env.dockerfile or env.compose_file:
            raise EnvironmentUnavailable(
                f"task {task.id} needs its own image; a pooled sandbox uses the endpoint's "
                "default image. Use open_task_sandbox(task, 'docker')")
        sb = pool.open(SandboxSpec(env=dict(env.env), network=bool(env.network)),
                       timeout=timeout)
        try:
            seed_files(sb, env.files, env.modes)
            for cmd in env.setup:
                r = sb.exec(cmd, timeout=max(60.0, task.agent_timeout_s))
                if not r.ok:
                    raise EnvironmentUnavailable(f"task {task.id}: setup `{cmd}` failed "
                                                 f"(exit {r.exit_code}): {r.stderr[-300:]}")
        except BaseException:
            sb.close()
            raise
        return sb

    return factory


def run_episode(task, policy: Policy, sandbox_factory: Callable[[Any], Any] | None = None,
                harness: HarnessConfig | None = None, *, policy_version: int | None = None,
                cancel: threading.Event | None = None, verify: bool = True) -> Trajectory:
    """Run one episode of `task` with `policy` (see the module doc). Never raises for
    episode failures (they become terminal reasons); raises EpisodeCancelled if `cancel` is
    set before the episode finished."""
    harness = harness or HarnessConfig()
    sandbox_factory = sandbox_factory or default_sandbox_factory
    t_start = time.monotonic()
    timings = {"sandbox_start_s": 0.0, "generation_s": 0.0, "exec_s": 0.0, "verify_s": 0.0,
               "summarize_s": 0.0}
    version = int(policy_version if policy_version is not None
                  else getattr(policy, "version", 0))
    traj = Trajectory(task_id=task.id, family=task.family, harness=harness.name,
                      policy_version=version, episode_id=uuid.uuid4().hex[:12],
                      timings=timings, meta={"terminal": harness.terminal,
                                             "action_format": harness.action_format})
    # the harness's clock, when set, replaces the task's (e.g. a slow CPU model evaluated on
    # tasks timed for an accelerator, configs/eval_smollm2.py); None: the task's
    budget = task.agent_timeout_s if harness.agent_timeout_s is None else harness.agent_timeout_s
    deadline = t_start + budget

    def cancelled():
        if cancel is not None and cancel.is_set():
            raise EpisodeCancelled(f"episode {traj.episode_id} ({task.id}) cancelled")

    try:
        sb = sandbox_factory(task)
    except Exception as e:  # noqa: BLE001 - one bad episode never stops a run
        traj.terminal_reason = TerminalReason.INFRASTRUCTURE_ERROR
        traj.error = f"sandbox start: {type(e).__name__}: {e}"
        timings["total_s"] = time.monotonic() - t_start
        return traj
    try:
        shell = _Shell(sb, harness, lifetime_s=budget + task.verifier.timeout_s + 60.0)
    except Exception as e:  # noqa: BLE001 - one bad episode never stops a run
        traj.terminal_reason = TerminalReason.INFRASTRUCTURE_ERROR
        traj.error = f"terminal session start: {type(e).__name__}: {e}"
        _close_quietly(sb)
        timings["total_s"] = time.monotonic() - t_start
        return traj
    timings["sandbox_start_s"] = time.monotonic() - t_start
    try:
        reason = _turn_loop(task, policy, shell, harness, traj, deadline, timings, cancelled)
        traj.terminal_reason = reason
        if reason != TerminalReason.INFRASTRUCTURE_ERROR and verify:
            _verify(task, sb, harness, traj, timings)
    finally:
        _close_quietly(sb)
        timings["total_s"] = time.monotonic() - t_start
    return traj


def _close_quietly(sb) -> None:
    try:
        sb.close()  # with its terminal session and everything that started
    except Exception:  # noqa: BLE001
        pass


class _Shell:
    """Where an episode's commands run: `sb.exec` per command ("exec"), or the sandbox's
    terminal session ("session"; a shell the agent exited is replaced at once, and the
    observation says so)."""

    def __init__(self, sb, harness: HarnessConfig, lifetime_s: float):
        self.sb, self.lifetime_s = sb, lifetime_s
        self.term = sb.open_session(lifetime_s) if harness.terminal == "session" else None

    def run(self, keystrokes: str, timeout: float):
        if self.term is None:
            return self.sb.exec(keystrokes, timeout=timeout)
        out = self.term.run(keystrokes, timeout)
        if not out.alive:
            self.term.close()
            self.term = self.sb.open_session(self.lifetime_s)
        return out


def _summarize(task, policy, harness, context, traj, turn, timings) -> str:
    t0 = time.monotonic()
    tok = policy.tokenizer
    if harness.summarizer is not None:
        text = harness.summarizer(safe_decode(tok, context))
    else:
        req_ids = continuation_ids(tok, "user", SUMMARY_REQUEST, context)
        out = policy.generate([GenerationRequest(
            context + req_ids, harness.max_summary_tokens, harness.sampling, task, turn,
            "summary")])[0]
        text = safe_decode(tok, out.token_ids)
    timings["summarize_s"] += time.monotonic() - t0
    return text


def _turn_loop(task, policy, shell, harness, traj, deadline, timings,
               cancelled) -> TerminalReason:
    tok = policy.tokenizer
    prompt = _render(tok, _initial_messages(task, harness))
    _record_public_prompt(tok, task, harness, traj, 0)
    context = list(prompt)
    new_prompt = list(prompt)
    segment = 0
    last_obs = ""
    parse_errors = 0
    for turn in range(harness.max_turns):
        cancelled()
        if time.monotonic() >= deadline:
            return TerminalReason.AGENT_TIMEOUT
        if (harness.summarize_threshold is not None and traj.turns
                and len(context) > harness.summarize_threshold):
            summary = _summarize(task, policy, harness, context, traj, turn, timings)
            summary += f"\n\nOutput of your last commands:\n{last_obs}" if last_obs else ""
            segment += 1
            traj.segments.append(Segment(segment, turn, segment - 1, summary))
            new_prompt = _render(tok, _initial_messages(task, harness, summary))
            _record_public_prompt(tok, task, harness, traj, segment, summary)
            context = list(new_prompt)
        if len(context) >= harness.max_input_tokens:
            return TerminalReason.CONTEXT_OVERFLOW
        t0 = time.monotonic()
        out = policy.generate([GenerationRequest(
            list(context), harness.max_output_tokens, harness.sampling, task, turn)])[0]
        timings["generation_s"] += time.monotonic() - t0
        cancelled()
        rec = Turn(prompt_ids=new_prompt, sampled_ids=list(out.token_ids),
                   logprobs=list(out.logprobs), segment=segment, stop_reason=out.stop_reason,
                   policy_version=out.policy_version)
        traj.turns.append(rec)
        if traj.prompt_at(turn) != context:  # the linear-history invariant
            raise AssertionError(f"turn {turn}: rebuilt prompt differs from the prompt fed")
        context += rec.sampled_ids
        new_prompt = []
        if out.stop_reason == "context":
            return TerminalReason.CONTEXT_OVERFLOW
        action, note = _parse_reply(safe_decode(tok, rec.sampled_ids), out.stop_reason,
                                    harness, rec)
        if action is None:
            parse_errors += 1
            if harness.max_parse_errors is not None and parse_errors >= harness.max_parse_errors:
                return TerminalReason.PARSE_ERRORS
        results = []
        if action is not None:
            results = _run_commands(action, shell, harness, traj, deadline, timings)
            if results is None:
                return TerminalReason.INFRASTRUCTURE_ERROR
            if action.task_complete:
                traj.declared_complete_turn = turn
                return TerminalReason.DECLARED_COMPLETE
        obs = format_observation(results, max_chars=harness.max_observation_chars, note=note)
        last_obs = obs
        if turn + 1 < harness.max_turns:
            rec.observation_ids = continuation_ids(tok, harness.observation_role, obs,
                                                   rec.sampled_ids)
            context += rec.observation_ids
    return TerminalReason.MAX_TURNS


def _parse_reply(text: str, stop_reason: str, harness: HarnessConfig,
                 rec: Turn) -> tuple[Action | None, str]:
    """(the reply's action, "") or, when it does not parse, (None, the note the agent is shown);
    a parse error is recorded on the turn."""
    try:
        return harness.parse(text), ""
    except ActionParseError as e:
        rec.parse_error = str(e)
        note = f"ERROR: could not parse your reply as an action: {e}"
        if stop_reason == "length":
            note += (f" (your reply was cut at the limit of {harness.max_output_tokens} "
                     "tokens per turn: write shorter actions)")
        return None, note


def _run_commands(action: Action, shell: _Shell, harness: HarnessConfig, traj: Trajectory,
                  deadline: float, timings: dict) -> list | None:
    """Run an action's commands while the episode's clock allows: [(command with the timeout
    used, result)]; None when the sandbox failed (`traj.error` says how). What was typed
    and read is recorded on the turn (`Turn.io`)."""
    t0 = time.monotonic()
    results = []
    for cmd in action.commands:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        timeout = min(cmd.timeout, harness.max_command_timeout_s, remaining)
        try:
            r = shell.run(cmd.keystrokes, timeout=max(timeout, 0.1))
        except BadRequest as e:
            # the sandbox refused this command (too long, a NUL...): the agent's
            # mistake, shown to it as the command's output; the episode goes on
            r = RejectedCommand(str(e))
            traj.meta["rejected_commands"] = traj.meta.get("rejected_commands", 0) + 1
        except SandboxError as e:  # SandboxLost included: the terminal or sandbox is gone
            traj.error = f"sandbox exec: {type(e).__name__}: {e}"
            timings["exec_s"] += time.monotonic() - t0
            return None
        results.append((dataclasses.replace(cmd, timeout=timeout), r))
        traj.turns[-1].io.append(_io_record(cmd.keystrokes, r, harness.max_observation_chars))
    timings["exec_s"] += time.monotonic() - t0
    return results


def _io_record(typed: str, r, max_chars: int) -> dict:
    """What was typed and what came back, for the trajectory (read text capped)."""
    if isinstance(r, RejectedCommand):
        return {"typed": typed, "read": "", "rejected": r.reason}
    if isinstance(r, SessionOutput):
        return {"typed": typed, "read": cap_text(r.text, max_chars), "done": r.done,
                "exit_code": r.exit_code, "seconds": round(r.duration_s, 4)}
    return {"typed": typed, "read": cap_text(r.stdout + r.stderr, max_chars), "done":
            not r.timed_out, "exit_code": r.exit_code, "seconds": round(r.duration_s, 4)}


def _verify(task, sb, harness, traj, timings) -> None:
    t0 = time.monotonic()
    try:
        res = verify_task(task, sb, backend=harness.verify_backend,
                          mode=harness.verifier_mode(task))
    except VerifierError as e:
        traj.terminal_reason = TerminalReason.VERIFIER_ERROR
        traj.error = str(e)
        return
    except Exception as e:  # noqa: BLE001 - the sandbox died under the verifier
        traj.terminal_reason = TerminalReason.INFRASTRUCTURE_ERROR
        traj.error = f"verification: {type(e).__name__}: {e}"
        return
    finally:
        timings["verify_s"] = time.monotonic() - t0
    traj.report = res.report.to_dict()
    traj.S, traj.P, traj.N = int(res.S), int(res.P), int(res.N)
    if res.failure:  # the verifier failed after its tests began: scored 0, kept for training
        traj.meta["verifier_failure"] = {"kind": res.failure, "reason": res.report.reason}
    tests = ((res.ctrf or {}).get("results") or {}).get("tests")
    if isinstance(tests, list):  # per-check outcomes for viewers (terminal_rsi.report)
        hygiene = set(res.report.hygiene_excluded)
        traj.meta["checks"] = [{"name": str(t.get("name")), "status": str(t.get("status")),
                                "hygiene": t.get("name") in hygiene}
                               for t in tests if isinstance(t, dict)]
