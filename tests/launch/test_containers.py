"""Container files: the trainer image copies what exists and installs extras setup.py has;
the registry-based sandbox Dockerfile matches the offline builder's recipe."""

from __future__ import annotations

import ast
import os
import re
import types

from launch.common import REPO
from terminal_rsi.sandbox import image


def _setup_lists() -> types.SimpleNamespace:
    """setup.py's INSTALL_REQUIRES and EXTRAS, without running setup()."""
    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    ns: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Call):
            exec(compile(ast.Module([node], []), "setup.py", "exec"), ns)
    return types.SimpleNamespace(INSTALL_REQUIRES=ns["INSTALL_REQUIRES"], EXTRAS=ns["EXTRAS"])


def _read(name: str) -> str:
    with open(os.path.join(REPO, "launch", name), encoding="utf-8") as f:
        return f.read()


def test_trainer_dockerfile_copies_existing_paths_and_known_extras():
    setup_extras = _setup_lists()
    text = _read("Dockerfile.trainer")
    for line in text.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert os.path.exists(os.path.join(REPO, src)), src
    extras = re.search(r'install "\.\[([a-z,]+)\]"', text).group(1).split(",")
    assert set(extras) <= set(setup_extras.EXTRAS)
    assert 'ENTRYPOINT ["python3", "experiments/run.py"]' in text
    jax_pin = re.search(r'"jax\[\$\{JAX_EXTRA\}\]([^"]+)"', text).group(1)
    assert [r for r in setup_extras.INSTALL_REQUIRES if r.startswith("jax")] == ["jax" + jax_pin]


def test_sandbox_dockerfile_matches_offline_recipe():
    text = _read("Dockerfile.sandbox")
    apt = re.search(r"install -y --no-install-recommends ([^;]+);", text).group(1)
    assert set(image.INCLUDE) <= set(apt.replace("\\", " ").split())
    for req in image.PY_REQS:
        assert req in text
    uid = str(image.SANDBOX_UID)
    assert f"USER {uid}:{uid}" in text and f"sandbox:x:{uid}:{uid}:" in text
    assert image.DEFAULT_IMAGE in text
    for line in image.DOCKERFILE.splitlines():
        if line.startswith(("USER", "WORKDIR", "ENV", "CMD")):
            assert line in text.splitlines(), line
