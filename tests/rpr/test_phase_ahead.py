"""One-batch-ahead RPR (`rollout.policy_lag = 1`): the lag the episodes carry, the behaviour
correction the loss applies, and a resume after kill -9 that trains on the same episodes as
an uninterrupted run (the batch in flight at the checkpoint is stored, not lost)."""

import os
import signal
import subprocess
import sys

import pytest

from terminal_rsi.rpr import run_phase
from tests.rpr.helpers import to_numpy, trees_equal, typed, untimed
from tests.rpr.test_phase import _config as sync_config

pytestmark = pytest.mark.xdist_group("rpr_phase")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ahead_config():
    """The phase test's tiny deterministic config (concurrency 1), one batch ahead: step 1
    updates the critic only, so the batch of step 3 is the first one sampled by a policy one
    version behind the actor it trains."""
    c = sync_config()
    c.num_steps = 4
    c.rollout.policy_lag = 1
    c.rollout.curriculum = "cyclic"
    c.ppo.critic_warmup_steps = 1
    c.eval.every = 0
    c.checkpoint.every = 2
    return typed(c)


# The first run, in its own process, killed with SIGKILL after step 3: the checkpoint of
# step 2 holds the batch of step 3, and the batch of step 4 is in flight when it dies.
KILLED_RUN = """
import os, signal, sys
from terminal_rsi.rpr import run_phase
from tests.rpr.test_phase_ahead import ahead_config
def on_step(step, actor, critic, row):
    if step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
run_phase(ahead_config(), sys.argv[1], on_step=on_step)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    killed = str(tmp_path_factory.mktemp("ahead_killed"))
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, killed], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    resumed = run_phase(ahead_config(), killed)
    straight = run_phase(ahead_config(), str(tmp_path_factory.mktemp("ahead_straight")))
    return dict(killed=killed, resumed=resumed, straight=straight)


def test_episodes_carry_the_lag_and_the_loss_corrects_it(runs):
    rows = runs["straight"].metrics
    assert [r["policy_version"] for r in rows] == [0, 1, 2, 3]
    # batch k+1 was sampled before step k's update: lag 0 while the actor was frozen (steps
    # 1-2), then 1
    assert [r["policy_lag_max"] for r in rows] == [0, 0, 1, 1]
    assert [r["policy_lag_frac_1"] for r in rows] == [0.0, 0.0, 1.0, 1.0]
    # auto: truncated importance weights at lag 1; its statistics are in the metrics
    assert ahead_config().loss_config().is_cap == 2.0
    for r in rows[1:]:
        assert 0.0 < r["actor/is_weight_mean"] <= 2.0
        assert 0.0 <= r["actor/is_truncated_frac"] <= 1.0
    # a lag-1 batch: π_old (the updated actor) differs from the sampler's π_behav
    assert rows[2]["logprob_gap_mean_abs"] > 10 * rows[1]["logprob_gap_mean_abs"]


def test_kill_9_and_resume_trains_on_the_same_episodes(runs):
    """SIGKILL after step 3 (batch 4 in flight, last checkpoint at step 2) and a resume: the
    stored batch of step 3 and a relaunched batch 4 give the uninterrupted run's metrics and
    parameters, bit for bit."""
    resumed, straight = runs["resumed"], runs["straight"]
    assert resumed.resumed_from == 2 and resumed.step == straight.step == 4
    assert untimed(resumed.metrics) == untimed(straight.metrics)
    for a, b in ((resumed.actor, straight.actor), (resumed.critic, straight.critic)):
        assert trees_equal(to_numpy(a.params), to_numpy(b.params))
    # only the kept checkpoints' batches stay on disk (step 4 ends the phase: none in flight)
    assert os.listdir(os.path.join(runs["killed"], "ahead")) == ["step_2.jsonl"]
