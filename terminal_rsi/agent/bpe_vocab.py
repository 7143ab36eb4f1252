"""The text the tiny model's BPE vocabulary (`terminal_rsi.models.bpe`) is trained on, and
the command that writes it:

    python -m terminal_rsi.agent.bpe_vocab --write     # models/assets/tiny_bpe.json
    python -m terminal_rsi.agent.bpe_vocab --check     # exit 1 if --write would change it
    python -m terminal_rsi.agent.bpe_vocab --measure   # tokens per byte: bytes vs the BPE

The corpus (`corpus`) is what the harness shows the model and what it writes, over the
training split only, so held-out evaluation tokenizes text the vocabulary was not fitted to:
the first `N_PER_FAMILY` seeds of every training family (`FAMILIES` and `TERMINAL_FAMILIES`
less `HELDOUT_FAMILIES` and `TERMINAL_HELDOUT_FAMILIES`) that are neither held out
(`heldout_seed`) nor validation seeds (`validation_seed`). Per instance (`instance_texts`):
the JSON short prompt of the family's terminal mode (the tiny scale's system prompt), the
user message "Task:\\n<instruction>", the reference actions in JSON (compact and full), and
observations as `format_observation` writes them: the reference commands with exit code 0,
and `cat` of every seeded file capped at `OBSERVATION_CHARS` (a stand-in for the real
outputs: nothing runs, so the corpus is the same on every machine). Per family once: every
action format's full and short system prompt, and a parse-error observation. The corpus, and
so the vocabulary, changes when the task families' text does; the shipped vocabulary is
frozen (`terminal_rsi.models.bpe`), so `--check` reporting a difference is no error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator

from terminal_rsi.agent.actions import ActionParseError, Command, format_observation
from terminal_rsi.agent.formats import FORMATS
from terminal_rsi.agent.harness import reference_action
from terminal_rsi.models.bpe import TINY_BPE_PATH, TINY_BPE_VOCAB, BPETokenizer, train_bpe
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.sandbox.base import ExecResult
from terminal_rsi.tasks.builtin import (
    FAMILIES,
    HELDOUT_FAMILIES,
    TERMINAL_FAMILIES,
    TERMINAL_HELDOUT_FAMILIES,
    heldout_seed,
    instance,
    make_task,
    validation_seed,
)

N_PER_FAMILY = 50  # training instances per family in the corpus
OBSERVATION_CHARS = 300  # a seeded file's `cat` shown as an observation (the tiny scale's cap)
BAD_REPLIES = ('{"commands":["ls"', "ls -la")  # replies that do not parse (error observations)


def training_families() -> list[str]:
    """The families the vocabulary sees: all but the held-out ones."""
    return ([f for f in FAMILIES if f not in HELDOUT_FAMILIES]
            + [f for f in TERMINAL_FAMILIES if f not in TERMINAL_HELDOUT_FAMILIES])


def training_seeds(family: str, n: int, start: int = 0) -> list[int]:
    """The first `n` seeds >= `start` of `family` that are neither held out nor validation
    seeds."""
    out, seed = [], start
    while len(out) < n:
        if not heldout_seed(family, seed) and not validation_seed(family, seed):
            out.append(seed)
        seed += 1
    return out


def terminal_of(family: str) -> str:
    return "session" if family in TERMINAL_FAMILIES else "exec"


def instance_texts(family: str, seed: int) -> dict[str, list[str]]:
    """The texts of one instance by kind: "instruction" (the user message), "solution" (the
    reference actions, compact and full JSON) and "observation" (module doc)."""
    task, inst, terminal = make_task(family, seed), instance(family, seed), terminal_of(family)
    turns = range(len(task.solution))
    actions = [reference_action(task, t, terminal, compact=c) for t in turns for c in (True, False)]
    ok = ExecResult(stdout="", stderr="", exit_code=0)
    obs = [format_observation([(Command(c.rstrip("\n")), ok) for c in step],
                              max_chars=OBSERVATION_CHARS) for step in task.solution]
    for path, data in sorted(inst.files.items()):
        shown = ExecResult(stdout=data.decode("utf-8", "replace"), stderr="", exit_code=0)
        obs.append(format_observation([(Command(f"cat {path}"), shown)],
                                      max_chars=OBSERVATION_CHARS))
    return {"instruction": [f"Task:\n{inst.instruction}"], "solution": actions,
            "observation": obs}


def family_texts(family: str) -> list[str]:
    """Once per family: every action format's prompts in its terminal mode, and the
    observations of replies that do not parse."""
    terminal = terminal_of(family)
    out = []
    for fmt in FORMATS.values():
        out += [fmt.system_prompt(terminal), fmt.short_prompt(terminal)]
    for bad in BAD_REPLIES:
        try:
            FORMATS["json"].parse(bad, terminal)
        except ActionParseError as e:
            out.append(format_observation(
                [], max_chars=OBSERVATION_CHARS,
                note=f"ERROR: could not parse your reply as an action: {e}"))
    return out


def corpus(n_per_family: int = N_PER_FAMILY) -> Iterator[str]:
    """The training texts of the vocabulary (module doc), in a fixed order."""
    for family in training_families():
        yield from family_texts(family)
        for seed in training_seeds(family, n_per_family):
            yield FORMATS["json"].short_prompt(terminal_of(family))
            for texts in instance_texts(family, seed).values():
                yield from texts


def build(vocab_size: int = TINY_BPE_VOCAB, n_per_family: int = N_PER_FAMILY) -> str:
    """The tokenizer.json text `--write` writes."""
    return train_bpe(corpus(n_per_family), vocab_size)


def tokens_per_byte(tok, n_per_family: int, start: int) -> dict[str, float]:
    """Mean tokens per UTF-8 byte of each kind of text over `n_per_family` training seeds
    >= `start` of every training family (seeds past the corpus's: text it was not fitted
    to, of the same distribution)."""
    sums: dict[str, list[float]] = {}
    for family in training_families():
        for seed in training_seeds(family, n_per_family, start):
            for kind, texts in instance_texts(family, seed).items():
                sums.setdefault(kind, []).extend(
                    len(tok.encode(t)) / len(t.encode("utf-8")) for t in texts if t)
    return {k: statistics.fmean(v) for k, v in sums.items()}


def measure(tok, n_per_family: int = 10) -> str:
    """A table of tokens per byte, the byte tokenizer (1.0) against `tok`."""
    start = 10 * N_PER_FAMILY  # past every corpus seed
    rows = [f"{'kind':<12} {'byte':>6} {'bpe':>6}"]
    byte = tokens_per_byte(ByteTokenizer(), n_per_family, start)
    for kind, v in tokens_per_byte(tok, n_per_family, start).items():
        rows.append(f"{kind:<12} {byte[kind]:6.3f} {v:6.3f}")
    n = n_per_family * len(training_families())
    return f"tokens per byte over {n} training instances (vocab {tok.vocab_size}):\n" + \
        "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m terminal_rsi.agent.bpe_vocab",
                                 description="train the tiny model's BPE vocabulary")
    ap.add_argument("--write", action="store_true", help=f"write {TINY_BPE_PATH}")
    ap.add_argument("--check", action="store_true", help="exit 1 if --write would change it")
    ap.add_argument("--measure", action="store_true", help="print tokens per byte")
    ap.add_argument("--vocab-size", type=int, default=TINY_BPE_VOCAB)
    ap.add_argument("--n-per-family", type=int, default=N_PER_FAMILY)
    ap.add_argument("--output", default=TINY_BPE_PATH)
    args = ap.parse_args(argv)
    text = build(args.vocab_size, args.n_per_family)
    if args.write:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.output} ({len(text)} bytes)")
    if args.check:
        with open(args.output, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.output} differs from what --write would write")
                return 1
        print(f"{args.output} is up to date")
    if args.measure:
        print(measure(BPETokenizer(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
