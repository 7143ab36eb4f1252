"""JAX's persistent compilation cache for the entry point (`experiments/run.py`).

On the 2-core CPU default, XLA compilation is a large share of a pipeline's wall time: every
(batch, cache-length) bucket of the sampler and every update width compiles once per jitted
function, and a new `Sampler` (one per RSR stage, one per process) compiles the same programs
again. With the persistent cache a program compiled once is loaded from disk by later stages,
later seeds and later runs (measured: a sampler's first call 24.6 s → 2.7 s for a second
instance in the same process, 6.2 s in a new process; docs/performance.md "compile_cache").

    enable()            # ~/.cache/terminal_rsi/jax, or $TERMINAL_RSI_COMPILATION_CACHE
    TERMINAL_RSI_COMPILATION_CACHE=off python experiments/run.py ...   # disabled

Entries are keyed by the program, the compiler flags and the device, so a cache never
returns a program for another shape, backend or JAX version.
"""

from __future__ import annotations

import os

ENV = "TERMINAL_RSI_COMPILATION_CACHE"
OFF = ("", "0", "off", "none", "false")


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "terminal_rsi", "jax")


def cache_dir() -> str | None:
    """The directory `enable` uses: $TERMINAL_RSI_COMPILATION_CACHE, else `default_dir()`;
    None when the variable says off (empty, 0, off, none, false)."""
    value = os.environ.get(ENV)
    if value is None:
        return default_dir()
    return None if value.strip().lower() in OFF else value


def enable(path: str | None = None, *, min_compile_time_s: float = 0.5) -> str | None:
    """Turn on JAX's persistent compilation cache in `path` (default: `cache_dir()`), for
    programs that took at least `min_compile_time_s` to compile. Returns the directory, or
    None when disabled. Call before the first jitted call of the process."""
    import jax

    path = path if path is not None else cache_dir()
    if path is None:
        return None
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
