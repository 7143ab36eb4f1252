"""Sandbox latency and throughput, as ratios against a bare ``subprocess.run`` in one run.

    python benchmarks/bench_sandbox.py [--n 40] [--concurrency 16] [--skip-docker]

Rows: exec round trip of ``true`` (p50, p95) for local-bwrap, local-plain,
Docker, and the HTTP bridge (loopback) in front of local-bwrap and Docker;
throughput (execs/s) with 16 concurrent sandboxes; sandbox creation time
cold, and from the Docker warm pool. A second table: file transfer
(``put_tar`` then ``get_tar`` of 2,000 small files and of one 32 MiB file) on
each backend against a bare ``tarfile`` extract and pack into a plain
directory (no link checks, no uid) in the same run. Needs root for the local backends' full
isolation, a running Docker engine and the sandbox image for the Docker rows.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from terminal_rsi.sandbox import SandboxSpec, open_sandbox  # noqa: E402


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def round_trips(fn, n):
    fn()  # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def start_server(backend: str, tmp: str):
    token = secrets.token_hex(16)
    tf = os.path.join(tmp, f"tok-{backend}")
    with open(os.open(tf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(token)
    pf = os.path.join(tmp, f"port-{backend}")
    proc = subprocess.Popen([sys.executable, "-m", "terminal_rsi.sandbox.serve",
                             f"--backend={backend}", "--port=0", f"--port-file={pf}",
                             f"--token-file={tf}", "--max-sandboxes=64"],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t_end = time.time() + 30
    while not os.path.exists(pf):
        if time.time() > t_end or proc.poll() is not None:
            raise RuntimeError(f"server {backend} did not start")
        time.sleep(0.05)
    from terminal_rsi.sandbox.remote import BridgeClient

    url = f"http://127.0.0.1:{open(pf).read()}"
    c = BridgeClient(url, token=token)
    while True:
        try:
            c.health()
            break
        except Exception:
            time.sleep(0.05)
    c.close()
    return proc, url, token


def transfer_payloads() -> dict[str, bytes]:
    from terminal_rsi.sandbox.base import files_to_tar

    small = {f"d{i % 20}/f{i}.txt": b"x" * 200 for i in range(2000)}
    return {"2,000 files x 200 B": files_to_tar(small),
            "1 file x 32 MiB": files_to_tar({"big.bin": os.urandom(32 << 20)})}


def bare_transfer(data: bytes) -> None:
    """The baseline: tarfile extract into a fresh directory, then pack it again."""
    import io
    import tarfile

    d = tempfile.mkdtemp(prefix="trsi-bench-bare-")
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            tf.extractall(d, filter="data")
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tf:
            tf.add(d, arcname=".")
    finally:
        shutil.rmtree(d)


def transfer_table(targets, n: int) -> None:
    payloads = transfer_payloads()
    print("\nfile transfer: put_tar then get_tar('.') of the same stream (median of "
          f"{n}); baseline: bare tarfile extract + pack in a temp dir\n")
    print("| backend | payload | ms | / baseline |")
    print("|---|---|---:|---:|")
    for label, data in payloads.items():
        base = statistics.median(round_trips(lambda data=data: bare_transfer(data), n))
        print(f"| bare tarfile (baseline) | {label} | {base * 1e3:.1f} | 1.0x |")
        for name, backend, kw in targets:
            with open_sandbox(SandboxSpec(disk_mb=256, memory_mb=1024), backend=backend,
                              **kw) as sb:
                times = []
                for _ in range(n + 1):  # the first is a warm-up
                    sb.exec("rm -rf ./*", timeout=60)
                    t0 = time.perf_counter()
                    sb.put_tar(data)
                    sb.get_tar(".", max_bytes=64 << 20)
                    times.append(time.perf_counter() - t0)
                t = statistics.median(times[1:])
            print(f"| {name} | {label} | {t * 1e3:.1f} | {t / base:.1f}x |")


class _Bare:
    """The baseline: a bare subprocess per command, no sandbox."""

    def exec(self, cmd, timeout):
        subprocess.run(["bash", "-c", cmd], timeout=timeout)

    def close(self):
        pass


def throughput(open_fn, conc: int, per: int) -> float:
    sbs = [open_fn() for _ in range(conc)]
    barrier = threading.Barrier(conc + 1)

    def work(sb):
        barrier.wait()
        for _ in range(per):
            sb.exec("true", timeout=30)

    ths = [threading.Thread(target=work, args=(sb,)) for sb in sbs]
    for t in ths:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ths:
        t.join()
    dt = time.perf_counter() - t0
    for sb in sbs:
        sb.close()
    return conc * per / dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--per", type=int, default=5, help="execs per sandbox in the throughput run")
    ap.add_argument("--skip-docker", action="store_true")
    ap.add_argument("--transfer-n", type=int, default=5, help="repeats of each transfer")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="trsi-bench-")
    spec = SandboxSpec()
    rows = []  # (what, p50, p95, execs/s, create cold, create warm)

    base = round_trips(lambda: subprocess.run(["bash", "-c", "true"]), args.n)
    base_tp = throughput(_Bare, args.concurrency, args.per)
    rows.append(("subprocess.run (baseline)", statistics.median(base), pct(base, 0.95),
                 base_tp, None, None))

    backends = ["local-bwrap", "local-plain"] + ([] if args.skip_docker else ["docker"])
    servers = []
    try:
        targets = [(b, b, {}) for b in backends]
        for b in ["local-bwrap"] + ([] if args.skip_docker else ["docker"]):
            proc, url, token = start_server(b, tmp)
            servers.append(proc)
            targets.append((f"bridge -> {b}", url, {"token": token}))
        for name, backend, kw in targets:
            def open_fn(backend=backend, kw=kw):
                return open_sandbox(spec, backend=backend, **kw)

            creates = []
            for _ in range(5):
                t0 = time.perf_counter()
                sb = open_fn()
                creates.append(time.perf_counter() - t0)
                sb.close()
            with open_fn() as sb:
                lat = round_trips(lambda sb=sb: sb.exec("true", timeout=30), args.n)
            tp = throughput(open_fn, args.concurrency, args.per)
            rows.append((name, statistics.median(lat), pct(lat, 0.95), tp,
                         statistics.median(creates), None))
            print(f"done: {name}", file=sys.stderr)
        if not args.skip_docker:
            from terminal_rsi.sandbox.docker_backend import DockerBackend

            be = DockerBackend(warm=5, warm_spec=spec)
            while be.pool.ready() < 5:
                time.sleep(0.1)
            warm = []
            for _ in range(5):
                t0 = time.perf_counter()
                sb = be.open(spec)
                warm.append(time.perf_counter() - t0)
                sb.close()
            be.close()
            rows = [r if r[0] != "docker" else (*r[:5], statistics.median(warm)) for r in rows]
        table_targets = targets
    finally:
        for p in servers:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)

    b50 = rows[0][1]
    print(f"\nexec round trip of `true` (n={args.n}), throughput with {args.concurrency} "
          f"concurrent sandboxes x {args.per} execs, creation (median of 5); "
          f"{os.cpu_count()} CPUs\n")
    print("| backend | p50 ms | p95 ms | p50 / baseline | execs/s (16 conc.) "
          "| create cold ms | create warm-pool ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, p50, p95, tp, cold, warm in rows:
        f = (lambda v: "-" if v is None else f"{v * 1e3:.1f}")
        print(f"| {name} | {p50 * 1e3:.1f} | {p95 * 1e3:.1f} | {p50 / b50:.1f}x | {tp:.0f} "
              f"| {f(cold)} | {f(warm)} |")
    transfer_table([t for t in table_targets if not t[0].startswith("bridge")], args.transfer_n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
