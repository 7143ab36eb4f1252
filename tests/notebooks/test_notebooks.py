"""Every notebook runs top to bottom on the CPU (nbclient, a real kernel) without errors, and
is committed without outputs."""

from __future__ import annotations

import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[notebooks]'")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[notebooks]'")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK_DIR = os.path.join(REPO, "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOK_DIR, "*.ipynb")))


def test_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert "01_tb_gae.ipynb" in names and "02_tiny_pipeline.ipynb" in names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_without_outputs_and_colab_ready(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), \
        "clear the outputs before committing (Kernel > Restart & Clear Output)"
    assert "google.colab" in code[0].source and "pip" in code[0].source
    assert any("jax.default_backend()" in c.source for c in code)


# What each notebook needs beyond the package (02 runs the `pipeline` experiment).
NEEDS = {"02_tiny_pipeline.ipynb": "pipeline"}
# 02 is a whole (smoke-sized) RSR -> RPR pipeline: minutes on a CPU.
SLOW = {"02_tiny_pipeline.ipynb"}


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=[pytest.mark.slow] if os.path.basename(p) in SLOW else [])
    for p in NOTEBOOKS], ids=os.path.basename)
def test_notebook_executes(path, tmp_path, monkeypatch):
    from terminal_rsi.config import registry

    need = NEEDS.get(os.path.basename(path))
    if need and need not in registry.EXPERIMENTS:
        pytest.skip(f"needs the {need!r} experiment, not registered in this checkout")
    monkeypatch.setenv("TERMINAL_RSI_NOTEBOOK_WORKDIR", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                                     resources={"metadata": {"path": NOTEBOOK_DIR}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream")
    assert "backend: cpu" in text or "backend: gpu" in text or "backend: tpu" in text
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, "the notebook's plots did not render"
