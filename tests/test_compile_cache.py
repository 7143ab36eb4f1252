"""The persistent compilation cache of the entry point (terminal_rsi.runtime.compile_cache)."""

import os
import subprocess
import sys

from terminal_rsi.runtime import compile_cache

PROGRAM = """
import sys, jax, jax.numpy as jnp
from terminal_rsi.runtime import compile_cache
print(compile_cache.enable(sys.argv[1], min_compile_time_s=0.0))
f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T + 1.0)
print(float(f(jnp.ones((8, 8))).sum()))
"""


def _run(path):
    out = subprocess.run([sys.executable, "-c", PROGRAM, path], capture_output=True, text=True,
                         check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return out.stdout.split()


def test_programs_are_written_and_reused(tmp_path):
    path = str(tmp_path / "cc")
    first = _run(path)
    assert first[0] == path
    entries = sorted(os.listdir(path))
    assert entries, "the first process wrote no cache entry"
    second = _run(path)
    assert second == first  # same result from the cached program
    assert sorted(os.listdir(path)) == entries  # nothing new compiled


def test_the_environment_variable_chooses_or_disables_the_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir() == str(tmp_path / "terminal_rsi" / "jax")
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "elsewhere"))
    assert compile_cache.cache_dir() == str(tmp_path / "elsewhere")
    for off in ("off", "0", "", "None"):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.cache_dir() is None
        assert compile_cache.enable() is None
