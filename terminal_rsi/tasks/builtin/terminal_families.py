"""Built-in families that need a real terminal (a persistent session per sandbox).

Each family's work only succeeds through `terminal_rsi.sandbox.terminal`: one interactive
shell for the whole episode, so a directory change, an exported variable or a background
server outlives the command that made it, a program can read its answers from the
terminal, and a hung command can be interrupted with C-c.

Reference and partial solutions are Terminus keystrokes, not shell commands: each string
ends with a newline (Enter: run it) or is exactly a tmux key name (``C-c``), and is typed
into the session with ``session.run(keystrokes, timeout)``. A command that keeps running
(``./job.sh`` waiting, ``./setup.sh`` at its prompt) is expected to be still running when
its wait ends. Run through `sb.exec` instead (no session), these solutions fail.

Checks need the environment the agent left (verifier mode ``shared``): the files its
session wrote, a server it left running (``service_left_running``, whose verifier is
``live``: the agent's processes keep running while ``run(cmd)`` queries the server), or
whether a job is still running (``interrupt_and_redo``), judged by the sandbox's process
list as the host saw it when the episode ended (`Sandbox.processes`): anything but the
session's tmux and its pane's shell, however renamed or detached. A file in the workspace
would not do: the agent can delete a lock file while the job holds it.

Scripts use bash, coreutils, util-linux ``flock`` (Debian essential) and the python3
standard library only, are deterministic per seed and finish at once when driven right.
"""

from __future__ import annotations

import posixpath
import random

from terminal_rsi.sandbox.base import MAX_PROCESSES
from terminal_rsi.tasks.builtin.core import (
    WORDS,
    Family,
    Instance,
    check,
    join_lines,
    lines,
    pick,
    sh_quote,
    text_eq,
)

PORTS = (20000, 59999)
SERVE_WAIT_S = 3.0  # how long the check waits for a just-started server to accept

# ----------------------------------------------------------------------------- 1 service

SERVER_PY = '''\
"""A tiny web service: answers every GET with its word."""
import argparse
import http.server

WORD = "@WORD@"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (WORD + "\\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print(fmt % args, flush=True)


def main():
    p = argparse.ArgumentParser(description="serve the word on 127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="the port set in server.conf")
    port = p.parse_args().port
    srv = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print(f"serving on 127.0.0.1:{port}", flush=True)
    srv.serve_forever()


main()
'''

# Prints "STATUS BODY" of GET http://127.0.0.1:PORT/, retrying while nothing accepts yet.
FETCH_PY = '''\
import sys, time, urllib.error, urllib.request
end = time.monotonic() + {wait}
while True:
    try:
        r = urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=3)
        print(r.status, r.read(4096).decode(errors="replace").strip())
        break
    except urllib.error.HTTPError as e:
        print(e.code, "")
        break
    except OSError as e:
        if time.monotonic() > end:
            sys.exit("no answer: %s" % e)
        time.sleep(0.1)
'''


def gen_service_left_running(rng: random.Random) -> Instance:
    word, name = pick(rng, WORDS, 2)
    port = rng.randint(*PORTS)
    probe = "python3 -c " + sh_quote(FETCH_PY.format(wait=SERVE_WAIT_S, port=port))

    def checks(s, run):
        r = run(probe, timeout=SERVE_WAIT_S + 10)
        status, _, body = r.stdout.strip().partition(" ") if r.exit_code == 0 else ("", "", "")
        why = f"exit {r.exit_code}: {(r.stdout + r.stderr).strip()[-200:]!r}"
        return [
            check(f"a web server answers on 127.0.0.1:{port}", status == "200", why),
            check("the server is server.py (it answers its word)", body.strip() == word, why),
        ]

    return Instance(
        instruction="Start server.py in the background on the port set in server.conf "
                    "(python3 server.py --port PORT), with its output in server.log, and "
                    "leave it running.",
        files={"server.py": SERVER_PY.replace("@WORD@", word).encode(),
               "server.conf": f"# {name} service\nname={name}\nport={port}\n".encode()},
        solution=[["cat server.conf\n"],
                  [f"python3 server.py --port {port} >server.log 2>&1 &\n"]],
        # a server on the right port, but the wrong one: P = 1 of 2
        partial=["cat server.conf\n", f"python3 -m http.server {port} >server.log 2>&1 &\n"],
        checks=checks,
        outputs=("server.log",),
        hidden=(str(port),),
        live=True,
    )


# ----------------------------------------------------------------------------- 2 shell state

REPORT_SH = '''\
#!/bin/bash
# report.sh: summarizes the project in the current directory (takes no arguments).
if [ -z "${@VAR@:-}" ]; then
  echo "warning: @VAR@ is not set in the environment (export it first)" >&2
fi
if [ ! -f data.txt ]; then
  echo "error: no data.txt in $PWD: run this from inside a project directory" >&2
  exit 1
fi
echo "${@VAR@:-unset} $(basename "$PWD") $(wc -l < data.txt)" > report.txt
echo "wrote report.txt"
'''


def gen_persistent_shell(rng: random.Random) -> Instance:
    names = pick(rng, WORDS, 3)
    target = names[0]
    var = rng.choice(["REPORT_KEY", "BUILD_TAG", "DEPLOY_ID", "RUN_TOKEN", "STAGE_KEY"])
    files: dict[str, bytes] = {"tools/report.sh": REPORT_SH.replace("@VAR@", var).encode()}
    keys, sizes = {}, {}
    for n in sorted(names):
        keys[n] = f"{rng.choice(WORDS)}-{rng.randint(1000, 9999)}"
        sizes[n] = rng.randint(2, 9)
        files[f"projects/{n}/key.txt"] = f"{keys[n]}\n".encode()
        files[f"projects/{n}/data.txt"] = join_lines(pick(rng, WORDS, sizes[n]))
    key, report = keys[target], f"projects/{target}/report.txt"

    def checks(s, run):
        got = (lines(s, report) or [""])[0].split()
        return [
            check(f"{report} was written", s.text(report) is not None),
            check(f"the report saw {var} exported", got[:1] == [key]),
            check(f"the report ran in projects/{target}", got[1:] == [target, str(sizes[target])]),
        ]

    return Instance(
        instruction=f"In projects/{target}, export {var} set to the key in its key.txt, then "
                    "run ../../tools/report.sh from that directory (no arguments).",
        files=files,
        solution=[[f"cd projects/{target}\n", "cat key.txt\n"],
                  [f"export {var}={key}\n", "../../tools/report.sh\n"]],
        # set but not exported: the script does not see it (P = 2 of 3)
        partial=[f"cd projects/{target}\n", f"{var}={key}\n", "../../tools/report.sh\n"],
        checks=checks,
        modes={"tools/report.sh": 0o755},
        outputs=(report,),
        hidden=(key,),
    )


# ----------------------------------------------------------------------------- 3 prompts

SETUP_SH = '''\
#!/bin/bash
# setup.sh: writes profile.conf. Answers are read from the terminal, not from stdin.
echo "Profiles available: @LIST@"
printf 'Proceed with setup? [y/N] '
read -r answer < /dev/tty
case "$answer" in
  y|Y|yes|YES) ;;
  *) echo "setup aborted"; exit 1;;
esac
printf 'Name of the profile: '
read -r name < /dev/tty
case "$name" in
  @CASES@) ;;
  *) echo "unknown profile: $name"; exit 1;;
esac
printf 'profile=%s\\nsetup_id=%s\\n' "$name" "@ID@" > profile.conf
echo "wrote profile.conf"
'''


def gen_interactive_prompt(rng: random.Random) -> Instance:
    profiles = pick(rng, WORDS, 3)
    rec = rng.choice(profiles)
    other = next(p for p in profiles if p != rec)
    setup_id = f"{rng.getrandbits(40):010x}"
    listing = ", ".join(p + (" (recommended)" if p == rec else "") for p in profiles)
    script = (SETUP_SH.replace("@LIST@", listing).replace("@CASES@", "|".join(profiles))
              .replace("@ID@", setup_id))

    def checks(s, run):
        got = lines(s, "profile.conf") or []
        return [
            check("profile.conf was written by setup.sh", f"setup_id={setup_id}" in got),
            check("the recommended profile was chosen", f"profile={rec}" in got
                  and sum(ln.startswith("profile=") for ln in got) == 1),
        ]

    return Instance(
        instruction="Run ./setup.sh and answer its questions: say yes, and choose the "
                    "profile it recommends.",
        files={"setup.sh": script.encode()},
        solution=[["./setup.sh\n"], ["y\n", f"{rec}\n"]],
        # a listed profile, not the recommended one: P = 1 of 2
        partial=["./setup.sh\n", "y\n", f"{other}\n"],
        checks=checks,
        modes={"setup.sh": 0o755},
        outputs=("profile.conf",),
        hidden=(rec,),
    )


# ----------------------------------------------------------------------------- 4 interrupt

JOB_SH = '''\
#!/bin/bash
# job.sh: writes @OUT@ from items.txt. One job.sh at a time (job.lock).
exec 9>>job.lock
if ! flock -n 9; then
  echo "job.sh: another job.sh is still running; stop it first" >&2
  exit 1
fi
if [ "${1:-}" != "@FLAG@" ]; then
  echo "job.sh: waiting for lock /var/lock/@WORD@-queue.lock ... (run with @FLAG@ to skip)"
  while :; do sleep 1; done
fi
echo "@WORD@ $(sort -u items.txt | wc -l)" > @OUT@
echo "job.sh: wrote @OUT@"
'''



SHELLS = ("bash", "sh", "dash")


def jobs_left_running(processes: tuple) -> list[str]:
    """What still runs besides the terminal session itself (its tmux processes and the one
    shell of its pane), as "pid argv": the job, however it was started or renamed (a hard
    link, ``exec -a``, a pipe into bash, a lock behind a symlink, a second tmux window), or
    anything else left running. A listing that is cut or partly unreadable is inconclusive
    and counts as something left running."""
    def exe(p) -> str:
        return posixpath.basename(p.exe or (p.argv[0] if p.argv else ""))

    tmux = {p.pid for p in processes if exe(p) == "tmux"}
    shells = sorted(p.pid for p in processes if p.ppid in tmux and exe(p) in SHELLS)
    session = tmux | set(shells[:1])
    left = [f"{p.pid} {' '.join(p.argv)[:80]}" for p in processes if p.pid not in session]
    if len(processes) >= MAX_PROCESSES or any(p.partial for p in processes):
        left.append("the process listing is incomplete")
    return left


def gen_interrupt_and_redo(rng: random.Random) -> Instance:
    word = rng.choice(WORDS)
    out = rng.choice(["result.txt", "summary.txt", "output.txt", "totals.txt"])
    flag = rng.choice(["--no-wait", "--skip-lock", "--force", "--now"])
    items = rng.choices(WORDS, k=rng.randint(5, 12))
    want = f"{word} {len(set(items))}"
    script = (JOB_SH.replace("@OUT@", out).replace("@FLAG@", flag)
              .replace("@WORD@", word))

    def checks(s, run):
        return [check(f"{out} has the job's result", text_eq(s, out, want))]

    def process_checks(processes):
        left = jobs_left_running(processes)
        return [check("no job.sh is left running", not left, f"still running: {left[:3]}")]

    return Instance(
        instruction=f"Run ./job.sh to produce {out}. If it hangs, stop it and rerun it the "
                    "way its message says.",
        files={"job.sh": script.encode(), "items.txt": join_lines(items)},
        solution=[["./job.sh\n"], ["C-c", f"./job.sh {flag}\n"]],
        # interrupted, never rerun: P = 1 of 2
        partial=["./job.sh\n", "C-c"],
        checks=checks,
        process_checks=process_checks,
        modes={"job.sh": 0o755},
        outputs=(out, "job.lock"),
        hidden=(flag,),
    )


TERMINAL_FAMILIES: tuple[Family, ...] = (
    Family("service_left_running", "background services", "medium", 2, (2, 2),
           gen_service_left_running, "start a server in the background and leave it running"),
    Family("persistent_shell", "shell state across turns (cd, export)", "easy", 2, (3, 3),
           gen_persistent_shell, "cd and export in one turn, rely on them in the next"),
    Family("interactive_prompt", "interactive programs (answering prompts)", "easy", 2,
           (2, 2), gen_interactive_prompt, "answer a script's questions at the terminal"),
    Family("interrupt_and_redo", "interrupting a hung command (C-c)", "medium", 2, (2, 2),
           gen_interrupt_and_redo, "press C-c on a command that waits forever, rerun it"),
)

__all__ = ["TERMINAL_FAMILIES"]
