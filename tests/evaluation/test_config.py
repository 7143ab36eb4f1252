"""The evaluate experiment's typed config: held-out families must be the suite's own."""

import pytest

from configs.evaluate import get_config as evaluate_config
from terminal_rsi.config.configuration import build
from terminal_rsi.evaluation.config import EvalConfig, EvalTasks
from terminal_rsi.settings import SettingError
from terminal_rsi.tasks.builtin import HELDOUT_FAMILIES, TERMINAL_HELDOUT_FAMILIES
from terminal_rsi.tasks.registry import heldout_families_problem


def test_heldout_families_are_the_suites_own():
    assert EvalTasks(heldout_families=HELDOUT_FAMILIES[:2]).heldout_families == \
        HELDOUT_FAMILIES[:2]
    assert EvalTasks(suite="terminal", heldout_families=TERMINAL_HELDOUT_FAMILIES)
    # a training family: the error says which, what the split holds and how to evaluate it
    with pytest.raises(SettingError) as e:
        EvalTasks(heldout_families=("archive", "config_edit", "nonesuch"))
    assert str(e.value) == (
        "EvalTasks.heldout_families = ('archive', 'config_edit', 'nonesuch'): "
        "['config_edit', 'nonesuch'] are not held-out families of suite 'builtin', which are "
        f"{list(HELDOUT_FAMILIES)}; to evaluate ['config_edit'] on instances no stage trains "
        "on, use tasks.suites=('heldout_instances',) with tasks.families=('config_edit',)")
    # an unknown name alone gets no hint; the built-in held-out trio is not the terminal suite's
    with pytest.raises(SettingError, match=r"\['nonesuch'\] are not held-out families of "
                                           r"suite 'builtin', which are \[[^]]*\]$"):
        EvalTasks(heldout_families=("nonesuch",))
    with pytest.raises(SettingError, match="suite 'terminal'"):
        EvalTasks(suite="terminal", heldout_families=("archive",))
    # from a config file, as the command line builds it
    c = evaluate_config()
    c.tasks.heldout_families = ("config_edit",)
    with pytest.raises(SettingError, match="config_edit"):
        build(EvalConfig, c)
    c.tasks.heldout_families = ("archive",)
    assert build(EvalConfig, c).tasks.heldout_families == ("archive",)


def test_a_task_directory_has_no_fixed_heldout_split(tmp_path):
    assert heldout_families_problem(str(tmp_path), ("anything",), "x") is None
    assert EvalTasks(suite=str(tmp_path), heldout_families=("anything",))
