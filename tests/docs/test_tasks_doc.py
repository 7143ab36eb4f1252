"""The worked task examples in docs/tasks.md load and pass verify_tasks (both formats), run
as their own tools run them: on the Docker backend (local backends refuse Terminal-Bench and
Harbor tasks). Needs a Docker engine and the task base image: fails in CI, skips elsewhere."""

from __future__ import annotations

import os
import re

from terminal_rsi.config import registry
from terminal_rsi.config.configdoc import load_config
from tests.tasks.conftest import need_task_image

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = re.compile(r"^#### `([^`]+)`\n```[a-z]*\n(.*?)^```$", re.M | re.S)


def test_doc_examples_pass_verify_tasks(tmp_path):
    need_task_image()
    with open(os.path.join(REPO, "docs", "tasks.md"), encoding="utf-8") as f:
        text = f.read()
    files = dict(BLOCK.findall(text))
    assert {p.split("/")[0] for p in files} == {"greet-tb", "greet-harbor"}
    assert "greet-tb/task.yaml" in files and "greet-harbor/task.toml" in files
    for rel, body in files.items():
        path = tmp_path / "tasks" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    config = load_config(os.path.join(REPO, "configs", "verify_tasks.py"))
    config.tasks.source = str(tmp_path / "tasks")
    config.tasks.backend = "docker"
    rows = registry.get_experiment("verify_tasks").run(config, str(tmp_path / "work"))
    verdicts = {r["task"]: r["verdict"] for r in rows}
    assert len(verdicts) == 2 and set(verdicts.values()) == {"PASS"}, rows
