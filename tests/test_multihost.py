"""Multi-process runs on one machine: `terminal_rsi.runtime.multihost` in two real JAX processes
(gloo CPU collectives, 2 virtual devices each, wired as the launchers wire them); an RPR
phase started by the TPU pod launcher's worker command, one batch ahead, with evaluation,
checkpoints and a resume; an RSR stage with a non-empty Q_clean; and the main job started by
the SLURM launcher's batch script."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from configs.rpr2_spr import get_config
from launch import slurm, tpu_pod
from terminal_rsi.agent.trajectory import read_shard
from terminal_rsi.config.configuration import build
from terminal_rsi.evaluation.config import EvalConfig
from terminal_rsi.evaluation.evaluate import evaluate
from terminal_rsi.pipeline import validate_ledger
from terminal_rsi.pipeline.handoff import restore_export
from terminal_rsi.pipeline.resolve import set_path
from terminal_rsi.pipeline.runner import Pipeline
from terminal_rsi.rsr.stage import StageSetup, run_rsr
from terminal_rsi.runtime import multihost
from tests.launch_standins import free_port, run_batch_script
from tests.rpr.helpers import trees_equal, untimed
from tests.rsr.helpers import follower_policy, tiny_stage_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# each test starts two JAX processes: on one xdist worker, so they never run four at once
pytestmark = pytest.mark.xdist_group("multihost")


def _start_two(argv: list[str], env_for, tmp_path, timeout: int,
               cwd: str = ROOT) -> list[str]:
    """Run `argv` as processes 0 and 1 of one distributed job, process i with the environment
    `env_for(i)`; their outputs (each must exit with status 0)."""
    procs = []
    for i in range(2):
        log = open(tmp_path / f"process_{i}.log", "w")
        procs.append((subprocess.Popen(argv, cwd=cwd, env=env_for(i), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    outs = []
    try:
        for p, log in procs:
            p.wait(timeout=timeout)
            log.close()
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, _) in enumerate(procs):
        out = (tmp_path / f"process_{i}.log").read_text()
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{out[-4000:]}"
        outs.append(out)
    return outs


def _coordinates(port: int, i: int) -> dict[str, str]:
    """Process i of two, coordinated on 127.0.0.1:port (what TPU pods and SLURM detect)."""
    return {"TERMINAL_RSI_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "TERMINAL_RSI_NUM_PROCESSES": "2", "TERMINAL_RSI_PROCESS_ID": str(i)}


def _run_two(args: list[str], tmp_path, timeout: int = 420) -> list[str]:
    """Start `python args...` as processes 0 and 1 of one distributed job (2 CPU devices
    each); their outputs."""
    port = free_port()
    return _start_two([sys.executable, *args], lambda i: {
        **os.environ, **_coordinates(port, i), "TERMINAL_RSI_DISTRIBUTED": "1",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": ROOT}, tmp_path, timeout)


def _run_tpu_worker_command(run_args: list[str], tmp_path, timeout: int = 420) -> list[str]:
    """The command `launch/tpu_pod.py` has every worker of a 2-host slice (v4-16) run (its
    --dry-run's last line), run by bash as two processes on this machine: from a home
    directory holding the project as `terminal_rsi`, `python3` this interpreter, and the
    coordinator, process count and id that JAX would detect on the pod given as
    TERMINAL_RSI_* variables (no TPU metadata here). Everything else comes from the command."""
    _, steps = tpu_pod.plan([
        "--name=trsi-test", "--zone=us-central2-b", "--accelerator-type=v4-16",
        "--install=none", "--create=never", "--env=JAX_PLATFORMS=cpu",
        "--env=XLA_FLAGS=--xla_force_host_platform_device_count=2", *run_args])
    assert "--worker=all" in steps[-1].argv
    command = steps[-1].argv[-1].removeprefix("--command=")
    home, bin_dir = tmp_path / "worker_home", tmp_path / "worker_bin"
    if not home.exists():
        home.mkdir()
        bin_dir.mkdir()
        (home / tpu_pod.REMOTE_DIR).symlink_to(ROOT)
        (bin_dir / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERMINAL_RSI_")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=ROOT)
    port = free_port()
    return _start_two(["bash", "-c", command], lambda i: {**env, **_coordinates(port, i)},
                      tmp_path, timeout, cwd=str(home))


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_process_share_partitions(count):
    for n in range(10):
        shares = [multihost.process_share(n, i, count) for i in range(count)]
        assert shares[0][0] == 0 and shares[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(shares[:-1], shares[1:], strict=True))
        sizes = [hi - lo for lo, hi in shares]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_process_seed_is_the_seed_on_one_process():
    assert multihost.process_seed(7) == 7 and multihost.process_seed(0) == 0


def test_one_process_is_the_identity():
    tree = {"w": jax.numpy.arange(3.0)}
    assert multihost.local_replica(tree) is tree
    assert multihost.gather([{"a": 1}]) == [{"a": 1}]
    assert multihost.is_writer() and not multihost.is_multiprocess()
    multihost.barrier("nothing")  # no-op
    assert multihost.run_share(lambda: 3) == 3
    with pytest.raises(ZeroDivisionError):  # one process: the exception itself
        multihost.run_share(lambda: 1 // 0)


PROBE = textwrap.dedent("""
    import json, os, sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from terminal_rsi.runtime import multihost, sharding
    from terminal_rsi.agent.trajectory import Trajectory, gather_trajectories
    assert sharding.maybe_initialize_distributed({})
    pid = jax.process_index()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    full = np.arange(32, dtype=np.float32).reshape(8, 4)
    # rows split over all 4 devices of both processes: no process holds the whole array
    sharded = jax.make_array_from_callback(full.shape, NamedSharding(mesh, PartitionSpec("data")),
                                           lambda idx: full[idx])
    replicated = jax.make_array_from_callback((3,), NamedSharding(mesh, PartitionSpec()),
                                              lambda idx: np.ones(3, np.float32)[idx])
    rep = multihost.local_replica({"s": sharded, "r": replicated, "host": np.full(2, pid)})
    got = multihost.gather([{"pid": pid, "k": k} for k in range(pid + 1)])
    trajs = gather_trajectories([Trajectory(f"t{pid}", "f", "h", policy_version=pid)])
    try:  # process 1's share raises: both processes learn it instead of process 0 waiting
        multihost.run_share(lambda: 1 // (pid - 1))
        failed = None
    except multihost.ShareFailed as e:
        failed = [str(e), type(e.__cause__).__name__]
    after = multihost.run_share(lambda: pid)  # and both go on together
    multihost.barrier("probe")
    out = dict(failed=failed, after=after, sharded_ok=bool(np.array_equal(rep["s"], full)),
               replicated_ok=bool(np.array_equal(rep["r"], np.ones(3))),
               host=rep["host"].tolist(), gathered=got, share=multihost.process_share(5),
               writer=multihost.is_writer(), addressable=sharded.is_fully_addressable,
               trajs=[t.task_id for t in trajs], seeds=multihost.process_seed(5))
    with open(os.path.join(sys.argv[1], f"{pid}.json"), "w") as f:
        json.dump(out, f)
    jax.distributed.shutdown()
""")


def test_collectives_in_two_processes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    _run_two([str(probe), str(tmp_path)], tmp_path, timeout=180)
    recs = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    gathered = [{"pid": 0, "k": 0}, {"pid": 1, "k": 0}, {"pid": 1, "k": 1}]
    for i, rec in enumerate(recs):
        assert rec["sharded_ok"] and rec["replicated_ok"] and not rec["addressable"]
        assert rec["host"] == [i, i]  # host data is this process's own
        assert rec["gathered"] == gathered  # process order, on every process
        assert rec["writer"] == (i == 0)
    assert [r["share"] for r in recs] == [[0, 3], [3, 5]]
    assert [r["trajs"] for r in recs] == [["t0", "t1"]] * 2  # trajectories round-trip
    assert recs[0]["seeds"] == 5 and recs[1]["seeds"] != 5  # process 1 draws its own stream
    for i, rec in enumerate(recs):
        message, cause = rec["failed"]
        assert message == ("1 of 2 processes failed in their share (process 1: "
                           "ZeroDivisionError: integer division or modulo by zero); every "
                           "process stops here")
        assert cause == ("ZeroDivisionError" if i == 1 else "NoneType")
        assert rec["after"] == i


def test_rpr_phase_in_two_processes(tmp_path):
    """configs/rpr_phase.py in two processes, started by the command the TPU pod launcher
    gives every worker, one batch ahead (concurrency 1), with evaluation and checkpoints:
    both finish; process 0 alone writes the metrics, every step trains on the whole batch and
    every evaluation covers every held-out task (each process's share, gathered), and each
    process keeps its share of the batch in flight beside the checkpoint. Then a crash after
    step 3 (the checkpoint of step 4 gone, every other file as the run left it) and the same
    command again: it resumes from step 2, trains step 3 on the two stored shares and ends
    with the uninterrupted run's metrics and weights, bit for bit."""
    work = tmp_path / "run"
    args = ["--config=configs/rpr_phase.py", f"--workdir={work}", "--config.num_steps=4",
            "--config.eval.every=2", "--config.checkpoint.every=2",
            "--config.ppo.critic_warmup_steps=1", "--config.rollout.policy_lag=1",
            "--config.rollout.batch_size=4", "--config.rollout.concurrency=1"]
    for out in _run_tpu_worker_command(args, tmp_path):
        assert "[rpr] done at step 4" in out
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["episodes"] == 4 for r in rows)
    assert [r["critic_only"] for r in rows] == [True, False, False, False]
    assert rows[2]["policy_lag_frac_1"] == 1.0  # step 3: sampled before step 2's update
    # evaluation: each process ran its share of the held-out tasks, all of them are recorded
    evals = [r for r in rows if r.get("eval/episodes") is not None]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        shard = read_shard(work / "trajectories" / f"eval_{r['step']:05d}.jsonl")
        assert r["eval/episodes"] == len(shard) == 2  # eval.num_tasks
        assert len({t.task_id for t in shard}) == 2
    for step in range(1, 5):
        trajs = read_shard(work / "trajectories" / f"step_{step:05d}.jsonl")
        assert len(trajs) == 4
    # the checkpoint of step 2 held step 3's batch: two shares of 2 episodes
    stored = [read_shard(work / "ahead" / f"process_{i}" / "step_2.jsonl") for i in range(2)]
    assert [len(share) for share in stored] == [2, 2]
    assert sorted(os.listdir(work / "export")) == ["actor", "critic"]
    summary = json.loads((work / "summary.json").read_text())
    assert summary["completed"] and summary["step"] == 4
    weights = {role: restore_export(str(work / "export"), role) for role in ("actor", "critic")}

    # the crash: step 4's checkpoint never written; metrics, shards and export of steps 3-4
    # stay behind as a killed run leaves them
    shutil.rmtree(work / "checkpoints" / "4")
    for out in _run_tpu_worker_command(args, tmp_path):
        assert "resumed from step 2" in out and "[rpr] done at step 4" in out
    again = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert untimed(again) == untimed(rows)
    step3 = read_shard(work / "trajectories" / "step_00003.jsonl")
    assert [(t.task_id, [x.sampled_ids for x in t.turns]) for t in step3] == \
        [(t.task_id, [x.sampled_ids for x in t.turns]) for t in stored[0] + stored[1]]
    for role, params in weights.items():
        assert trees_equal(restore_export(str(work / "export"), role), params), role


def _run_slurm_script(run_args: list[str], tmp_path, timeout: int = 420) -> list[str]:
    """The batch script `launch/slurm.py --nodes=2` renders for `run_args` (what its
    --dry-run prints), run with bash on this machine: two processes, 2 CPU devices each."""
    text, _ = slurm.render([
        "--nodes=2", "--gpus-per-node=0", f"--port={free_port()}", f"--project-dir={ROOT}",
        f"--python={sys.executable}", "--env=XLA_FLAGS=--xla_force_host_platform_device_count=2",
        "--env=JAX_PLATFORMS=cpu", f"--env=PYTHONPATH={ROOT}", *run_args])
    return run_batch_script(text, tmp_path, ("127.0.0.1", "127.0.0.1"), timeout)


def test_main_job_in_two_processes(tmp_path):
    """The main job (configs/rpr2_spr.py at the test scale) in two processes, started by the
    batch script the SLURM launcher renders: every stage runs in both, is validated and
    evaluated, and process 0 keeps the ledger; rerun, every stage is reused. Evaluation
    splits its episodes across the processes with their random streams: the base's held-out
    episodes are those one process samples alone."""
    work = tmp_path / "run"
    args = ["--config=configs/rpr2_spr.py", f"--workdir={work}", "--config.scale=test"]
    stages = ["base", "rsr1", "warmup_critic", "rpr1_fdr", "rsr2", "rpr2_spr"]
    for out in _run_slurm_script(args, tmp_path):
        assert f"trained now: {', '.join(stages)}" in out
    ledger = json.loads((work / "ledger.json").read_text())
    validate_ledger(ledger)
    by = {s["name"]: s for s in ledger["stages"]}
    assert list(by) == stages
    for name, s in by.items():
        assert s["status"] == "done" and set(s["eval"]) == {"heldout_instances",
                                                            "heldout_families"}
        if name != "warmup_critic":
            assert s["validation"]["decision"] in ("base", "kept", "input")
    assert os.path.exists(work / "plots" / "progression.png")
    # each RSR shard holds every process's episodes (discovery: 2 tasks x 2 harnesses)
    assert len(read_shard(work / "rsr1" / "trajectories" / "discovery.jsonl")) == 4
    # evaluation: one process alone, same export and settings, samples the same episodes
    cfg = get_config()
    cfg.scale = "test"
    ev_cfg = Pipeline(cfg, str(work), log=lambda s: None).eval_base_config()
    set_path(ev_cfg, "init.actor_weights", str(work / "base" / "export"))
    alone = evaluate(build(EvalConfig, ev_cfg), str(tmp_path / "alone"), log=lambda s: None)
    split = by["base"]["eval"]["heldout_instances"]
    assert alone["heldout_instances"]["mean_at_k"] == split["mean_at_k"]

    def episodes(path):
        return {t.meta["launch_index"]: [x.sampled_ids for x in t.turns]
                for t in read_shard(path)}

    ran = episodes(work / "base" / "eval" / "heldout_instances.jsonl")
    assert len(ran) == split["k"] * split["num_tasks"]
    assert ran == episodes(tmp_path / "alone" / "heldout_instances.jsonl")
    for out in _run_slurm_script(args, tmp_path):
        assert "trained now: none" in out


RSR_PROBE = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from terminal_rsi.runtime import multihost, sharding
    assert sharding.maybe_initialize_distributed({})
    from terminal_rsi.rsr.stage import StageSetup, run_rsr
    from tests.rsr.helpers import follower_policy, tiny_stage_config
    # the actor's sampler follows the runbooks perfectly, so Q_clean is not empty
    StageSetup.policy = lambda setup, actor, seed: follower_policy(setup.tokenizer)
    res = run_rsr(tiny_stage_config(**json.loads(sys.argv[2])), sys.argv[1])
    actor = multihost.host_copy(res.actor.params)
    if multihost.is_writer():
        np.save(os.path.join(sys.argv[1], "embed.npy"), actor["backbone"]["embed"])
    # the policy planner split over the processes: Q_clean's episodes stand in for successes
    import jax
    from types import SimpleNamespace
    from terminal_rsi.agent import ScriptedPolicy
    from terminal_rsi.rsr.planner import PolicyPlanner, plan_successes
    def reply(r):  # the even tasks get a runbook, the odd ones text that does not parse
        i = int(r.task.instruction)
        if i % 2:
            return f"no runbook for {i}"
        return (f"Runbook: task {i} on process {jax.process_index()}\\n1. run: echo {i}\\n"
                "2. declare the task complete")
    from terminal_rsi.models.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    policy = ScriptedPolicy(tok, reply)
    successes = [SimpleNamespace(task=SimpleNamespace(id=t.task_id, instruction=str(i)),
                                 trajectory=t) for i, t in enumerate(res.q_clean)]
    plans = plan_successes(PolicyPlanner(policy, k=2), successes, tok)
    with open(os.path.join(sys.argv[1], f"plans_{jax.process_index()}.json"), "w") as f:
        json.dump({"generate_calls": policy.calls,
                   "plans": [[[p.text, p.error, p.runbook and p.runbook.goal] for p in ps]
                             for ps in plans]}, f)
""")


def test_rsr_stage_in_two_processes(tmp_path, monkeypatch):
    """An RSR stage with a non-empty Q_clean in two processes (discovery and fresh execution
    split and gathered, the SFT sharded over 4 devices) keeps what one process keeps and
    trains the same actor, up to float summation order."""
    over = {"eval.rewritten": False, "execution.m": 1, "sft.steps": 3}
    probe = tmp_path / "rsr_probe.py"
    probe.write_text(RSR_PROBE)
    work = tmp_path / "two"
    _run_two([str(probe), str(work), json.dumps(over)], tmp_path, timeout=300)
    two = json.loads((work / "summary.json").read_text())
    monkeypatch.setattr(StageSetup, "policy",
                        lambda setup, actor, seed: follower_policy(setup.tokenizer))
    one = run_rsr(tiny_stage_config(**over), str(tmp_path / "one"))
    assert two["q_clean_size"] == one.summary["q_clean_size"] >= 2
    assert two["sft_steps"] == one.summary["sft_steps"] == 3
    assert two["discovery_verified"] == one.summary["discovery_verified"]
    assert len(read_shard(work / "trajectories" / "fresh.jsonl")) == two["fresh_executions"]
    np.testing.assert_allclose(two["nll_after"], one.summary["nll_after"], rtol=1e-4)
    np.testing.assert_allclose(np.load(work / "embed.npy"),
                               np.asarray(one.actor.params["backbone"]["embed"]),
                               rtol=1e-4, atol=1e-6)
    # the policy planner: each process generated its share (one call per success), and both
    # hold every plan, in order, parsed the same
    runs = [json.loads((work / f"plans_{i}.json").read_text()) for i in range(2)]
    assert runs[0] == {**runs[1], "generate_calls": runs[0]["generate_calls"]}
    n = two["q_clean_size"]
    assert [r["generate_calls"] for r in runs] == [(n + 1) // 2, n // 2]
    plans = runs[0]["plans"]
    assert len(plans) == n and all(len(ps) == 2 for ps in plans)
    for i, ps in enumerate(plans):
        for _text, error, goal in ps:
            if i % 2:
                assert goal is None and "no 'Runbook:' line" in error
            else:
                assert error is None and goal == f"task {i} on process {int(i >= (n + 1) // 2)}"
