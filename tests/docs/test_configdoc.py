"""docs/configs.md is generated from configs/*.py and the schemas, and is not stale."""

from __future__ import annotations

import glob
import os

import pytest

from terminal_rsi.config import configdoc, registry
from terminal_rsi.config.configuration import flatten

# module/session-scoped fixtures are expensive: keep these tests on one xdist worker
pytestmark = pytest.mark.xdist_group("configdoc")

REPO = configdoc.REPO


@pytest.fixture(scope="module")
def text():
    return configdoc.generate()


def test_docs_configs_md_is_current(text):
    with open(configdoc.DOC_PATH, encoding="utf-8") as f:
        current = f.read()
    assert current == text, ("docs/configs.md is stale: regenerate it with "
                             "`python -m terminal_rsi.config.configdoc`")


def test_every_field_of_every_config_has_a_row_with_its_default(text):
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "[!_]*.py"))):
        config = configdoc.load_config(path)
        schema = registry.get_experiment(config.experiment).SCHEMA
        section = text.split(f"## `configs/{os.path.basename(path)}`")[1].split("\n## ")[0]
        group = getattr(schema, "doc_group", lambda f: None)  # families shown as one row
        for field, value in flatten(config).items():
            name = group(field) or field
            row = next(ln for ln in section.splitlines() if ln.startswith(f"| `{name}` |"))
            assert configdoc.table_cell(configdoc.format_value(value)) in row
            assert configdoc.table_cell(schema[field].doc) in row


def test_check_mode_and_schema_drift(tmp_path):
    out = tmp_path / "configs.md"
    assert configdoc.main(["--output", str(out)]) == 0
    assert configdoc.main(["--check", "--output", str(out)]) == 0
    out.write_text(out.read_text().replace("global PRNG seed", "old text"))
    assert configdoc.main(["--check", "--output", str(out)]) == 1
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bad.py").write_text(
        "import ml_collections\n"
        "def get_config():\n"
        "    return ml_collections.ConfigDict({'experiment': 'credit_diagnostic', 'seed': 0,"
        " 'no_such_field': 1})\n")
    with pytest.raises(configdoc.ConfigDocError, match="no_such_field"):
        configdoc.generate(repo=str(tmp_path))
