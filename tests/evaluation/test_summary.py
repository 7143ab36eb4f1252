"""summarize_suite: Mean@k vs pass@k, missing attempts as failures, per-family FDR/SPR
rescoring, strata and process reward on hand-built trajectories."""

import numpy as np

from terminal_rsi.agent.trajectory import TerminalReason, Trajectory
from terminal_rsi.evaluation import StrataTable, summarize_suite
from terminal_rsi.rewards import FamilyDivisors
from terminal_rsi.tasks import get_suite


def _traj(task, S, P, N):  # noqa: N803
    return Trajectory(task_id=task.id, family=task.family, harness="eval", policy_version=0,
                      terminal_reason=TerminalReason.DECLARED_COMPLETE,
                      report={"valid": True}, S=S, P=P, N=N)


def test_summarize_suite_by_hand():
    tasks = list(get_suite("builtin", "test", n_per_family=1,
                           families=("create_file", "count_lines")))
    a, b = tasks  # create_file (1 check), count_lines (2 checks)
    runs = [[_traj(a, 1, 1, 1), _traj(b, 0, 1, 2)],
            [_traj(a, 0, 0, 1), None],               # a missing attempt is a failure
            [_traj(a, 1, 1, 1), _traj(b, 0, 0, 2)]]
    strata = StrataTable((0.3, 0.5, 0.7), {a.id: "Q1", b.id: "Q3"})
    div = FamilyDivisors({"create_file": 2.0, "count_lines": 4.0})
    out = summarize_suite(tasks, runs, divisors=div, strata=strata, trajectories="x.jsonl")
    assert out["k"] == 3 and out["num_tasks"] == 2 and out["missing"] == 1
    assert abs(out["mean_at_k"] - 2 / 6) < 1e-6
    np.testing.assert_allclose(out["run_success"], [0.5, 0.0, 0.5])
    # pass@1 = mean c/n = (2/3 + 0)/2; pass@3 = (1 + 0)/2
    assert abs(out["pass_at_k"]["1"] - 1 / 3) < 1e-5 and abs(out["pass_at_k"]["3"] - 0.5) < 1e-6
    # process reward P/N: a: 1, 0, 1; b: 0.5, 0 (missing), 0
    assert abs(out["process_reward"] - (2 + 0.5) / 6) < 1e-6
    fam = out["per_family"]
    assert fam["create_file"]["n"] == 1 and abs(fam["create_file"]["success"] - 2 / 3) < 1e-6
    # FDR = P / D_f; SPR = S + P / (P + D_f)
    assert abs(fam["create_file"]["fdr"] - (0.5 + 0 + 0.5) / 3) < 1e-6
    assert abs(fam["create_file"]["spr"] - (2 * (1 + 1 / 3)) / 3) < 1e-6
    assert abs(fam["count_lines"]["fdr"] - (0.25 + 0 + 0) / 3) < 1e-6
    assert abs(fam["count_lines"]["spr"] - (1 / 5) / 3) < 1e-6
    assert out["strata"]["Q1"]["n"] == 1 and abs(out["strata"]["Q1"]["success"] - 2 / 3) < 1e-6
    assert out["strata"]["Q3"]["success"] == 0.0 and out["strata"]["Q2"]["n"] == 0
    assert out["trajectories"] == "x.jsonl" and out["explained_variance"] is None
