"""An installed package runs the pipeline (issue 50): the wheel (`pip install .`, not `-e`),
built from a copy of the checkout's sources, goes into a fresh venv (system site-packages give
jax and the other dependencies; the wheel itself goes in with --no-deps), and from a directory
outside the checkout `terminal_rsi` is imported from the venv alone and resolves every stage
of the main job (configs/rpr2_spr.py) at the `ci` scale to the same config hashes as the
checkout; the installed `terminal-rsi` command finds `configs/rpr2_spr.py` in the package."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from terminal_rsi.config.configuration import validate_config
from terminal_rsi.configs.rpr2_spr import get_config
from terminal_rsi.pipeline.config import SCHEMA, resolved
from terminal_rsi.pipeline.runner import Pipeline

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "terminal_rsi")

# Run by the venv's python outside the checkout. The checkout's editable install (a meta path
# finder among the system site-packages) is dropped first: it must not stand in for anything
# the wheel lacks. Every terminal_rsi module imported is listed, to be checked.
CHILD = r"""
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
import terminal_rsi
from terminal_rsi.configs.rpr2_spr import get_config
from terminal_rsi.config.configuration import validate_config
from terminal_rsi.pipeline.config import SCHEMA, resolved
from terminal_rsi.pipeline.runner import Pipeline

c = get_config()
c.scale = "ci"
validate_config(c, SCHEMA)
p = Pipeline(resolved(c), "run", log=lambda line: None)
p.resolve_all()
files = sorted({m.__file__ for n, m in list(sys.modules.items())
                if n.split(".")[0] == "terminal_rsi" and getattr(m, "__file__", None)})
print(json.dumps({"package": terminal_rsi.__file__, "files": files, "order": p.order,
                  "hashes": {n: p.config_hash(n) for n in p.order}}))
"""

# The tiny model's BPE vocabulary (model.tokenizer = "bpe") is package data (MANIFEST.in).
BPE_CHILD = r"""
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
from terminal_rsi.models.bpe import TINY_BPE_PATH, tiny_bpe
print(json.dumps({"path": TINY_BPE_PATH, "vocab_size": tiny_bpe().vocab_size}))
"""

def _run(cmd, cwd, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc


def _ok(proc):
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(venv dir, a work dir outside the checkout) with the wheel installed."""
    try:
        import wheel  # noqa: F401  (bdist_wheel without build isolation; the test extras)
    except ImportError:
        pytest.fail("the `wheel` package is missing: pip install -e '.[test]'")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: the build writes build/ and *.egg-info next to the sources
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    _ok(_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "--no-index", "-w", tmp / "dist", src], tmp))
    wheels = list((tmp / "dist").glob("terminal_rsi-*.whl"))
    assert len(wheels) == 1, wheels
    _ok(_run([sys.executable, "-m", "venv", "--system-site-packages", tmp / "venv"], tmp))
    _ok(_run([tmp / "venv" / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps",
              "--no-index", wheels[0]], tmp))
    work = tmp / "elsewhere"
    work.mkdir()
    return tmp / "venv", work


def test_the_installed_package_resolves_every_stage_of_the_main_job(venv, tmp_path):
    env_dir, work = venv
    out = json.loads(_ok(_run([env_dir / "bin" / "python", "-c", CHILD], work)).stdout)
    site = str(env_dir / "lib")
    assert out["package"].startswith(site), out["package"]
    assert out["files"] and all(f.startswith(site) for f in out["files"]), [
        f for f in out["files"] if not f.startswith(site)]
    assert any("/terminal_rsi/configs/rpr2_fdr.py" in f for f in out["files"])
    # the same stages and config hashes as the checkout resolves
    c = get_config()
    c.scale = "ci"
    validate_config(c, SCHEMA)
    here = Pipeline(resolved(c), str(tmp_path / "run"), log=lambda line: None)
    here.resolve_all()
    assert out["order"] == here.order == ["base", "rsr1", "warmup_critic", "rpr1_fdr", "rsr2",
                                          "rpr2_spr"]
    assert out["hashes"] == {n: here.config_hash(n) for n in here.order}


def test_the_installed_command_finds_the_packaged_config(venv):
    env_dir, work = venv
    proc = _run([env_dir / "bin" / "terminal-rsi", "--config=configs/rpr2_spr.py",
                 "--config.tasks.backend=bogus"], work)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "config.tasks.backend = 'bogus' is not allowed" in proc.stderr
    assert not (work / "configs").exists()


def test_the_installed_package_carries_the_bpe_vocabulary(venv):
    pytest.importorskip("tokenizers")
    env_dir, work = venv
    out = json.loads(_ok(_run([env_dir / "bin" / "python", "-c", BPE_CHILD], work)).stdout)
    assert out["path"].startswith(str(env_dir / "lib")) and out["vocab_size"] == 1024
