"""Terminal sessions on the Docker backend: tmux in the default image, a pty shell in an
image without tmux, exec beside a live session, cleanup; and the pty key mapping.

One container per image serves the module: every test opens its own session and closing
it kills every process of the sandbox user, so tests start from a quiet container.
"""

from __future__ import annotations

import io
import tarfile
import threading
import time

import pytest

from terminal_rsi.sandbox import BadRequest, SandboxLost, SandboxSpec
from terminal_rsi.sandbox.pty_session import key_bytes
from terminal_rsi.sandbox.terminal import is_key_name

NO_TMUX_REPO = "trsi-test-notmux"
PS = "ps -eo pid=,args="

# ----------------------------------------------------------------------- key mapping (no engine)


@pytest.mark.parametrize("name,expected", [
    ("C-c", b"\x03"), ("C-d", b"\x04"), ("C-a", b"\x01"), ("C-z", b"\x1a"), ("C-Z", b"\x1a"),
    ("C-@", b"\x00"), ("C-Space", b"\x00"), ("C-[", b"\x1b"), ("C-\\", b"\x1c"),
    ("C-]", b"\x1d"), ("C-_", b"\x1f"), ("C-?", b"\x7f"),
    ("Enter", b"\r"), ("Escape", b"\x1b"), ("Tab", b"\t"), ("BTab", b"\x1b[Z"),
    ("S-Tab", b"\x1b[Z"), ("BSpace", b"\x7f"), ("Space", b" "),
    ("Up", b"\x1b[A"), ("Down", b"\x1b[B"), ("Right", b"\x1b[C"), ("Left", b"\x1b[D"),
    ("Home", b"\x1b[H"), ("End", b"\x1b[F"), ("Insert", b"\x1b[2~"), ("IC", b"\x1b[2~"),
    ("Delete", b"\x1b[3~"), ("DC", b"\x1b[3~"), ("PageUp", b"\x1b[5~"), ("PgUp", b"\x1b[5~"),
    ("PPage", b"\x1b[5~"), ("PageDown", b"\x1b[6~"), ("PgDn", b"\x1b[6~"),
    ("NPage", b"\x1b[6~"),
    ("F1", b"\x1bOP"), ("F4", b"\x1bOS"), ("F5", b"\x1b[15~"), ("F10", b"\x1b[21~"),
    ("F12", b"\x1b[24~"),
    ("M-x", b"\x1bx"), ("M-X", b"\x1bX"), ("M-.", b"\x1b."), ("M-Enter", b"\x1b\r"),
    ("C-M-x", b"\x1b\x18"), ("M-C-x", b"\x1b\x18"), ("S-a", b"A"), ("M-Up", b"\x1b[1;3A"),
    ("C-Left", b"\x1b[1;5D"), ("S-Right", b"\x1b[1;2C"), ("C-S-Home", b"\x1b[1;6H"),
    ("C-F1", b"\x1b[1;5P"), ("S-F5", b"\x1b[15;2~"), ("C-Delete", b"\x1b[3;5~"),
])
def test_key_bytes(name, expected):
    assert is_key_name(name)
    assert key_bytes(name) == expected


@pytest.mark.parametrize("name", ["S-1", "C-1", "C-Enter", "S-Escape", "C-BSpace"])
def test_key_bytes_refuses_keys_without_a_sequence(name):
    assert is_key_name(name)
    with pytest.raises(BadRequest, match="cannot be sent"):
        key_bytes(name)


@pytest.mark.parametrize("text", ["ls", "Ctrl-c", "c", "F13", ""])
def test_key_bytes_refuses_text(text):
    with pytest.raises(BadRequest, match="not a tmux key name"):
        key_bytes(text)


# ----------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def no_tmux_image(client):
    """The default image without tmux, built once per default image (cached by tag)."""
    from terminal_rsi.sandbox.image import DEFAULT_IMAGE

    base = client.images.get(DEFAULT_IMAGE)
    tag = f"{NO_TMUX_REPO}:{base.id.split(':')[-1][:12]}"
    try:
        client.images.get(tag)
        return tag
    except Exception:  # noqa: BLE001 - not built yet
        pass
    dockerfile = (f"FROM {DEFAULT_IMAGE}\nUSER root\nRUN rm -f /usr/bin/tmux\n"
                  "USER 1000:1000\n").encode()
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tf:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tf.addfile(info, io.BytesIO(dockerfile))
    ctx.seek(0)
    client.images.build(fileobj=ctx, custom_context=True, tag=tag, network_mode="none",
                        pull=False, rm=True, forcerm=True)
    return tag


def _sandbox(client, image: str | None = None):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    spec = SandboxSpec(memory_mb=512, pids=128, disk_mb=64)
    if image:
        spec = SandboxSpec(memory_mb=512, pids=128, disk_mb=64, image=image)
    return DockerSandbox(spec, client=client)


@pytest.fixture(scope="module")
def tmux_sb(client):
    sb = _sandbox(client)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def pty_sb(client, no_tmux_image):
    sb = _sandbox(client, no_tmux_image)
    yield sb
    sb.close()


@pytest.fixture(params=["tmux", "pty"])
def sb(request):
    return request.getfixturevalue(f"{request.param}_sb")


@pytest.fixture
def term(sb):
    t = sb.open_session()
    yield t
    t.close()


def _others(sb) -> list[str]:
    """The container's processes but pid 1's loop and the probe's own exec."""
    r = sb.exec(PS, timeout=10)
    assert r.exit_code == 0, r
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    return [ln for ln in lines if PS not in ln and ln.split(None, 1)[1] != "sleep 86400"
            and not ln.startswith("1 ")]


# ----------------------------------------------------------------------- sessions


def test_session_kind(sb, term):
    from terminal_rsi.sandbox.pty_session import PtySession
    from terminal_rsi.sandbox.terminal import TmuxSession

    assert isinstance(term, PtySession if "notmux" in sb.spec.image else TmuxSession)
    out = term.run("stty size\n", 5)
    assert out.done and "\n50 200\n" in out.text


def test_cd_and_export_persist(term):
    assert term.run("mkdir -p sub && cd sub; export GREETING=hi-there\n", 5).done
    out = term.run("pwd; echo $GREETING\n", 5)
    assert out.done and out.exit_code == 0
    assert "/workspace/sub\nhi-there\n" in out.text
    out = term.run("false\n", 5)
    assert out.done and out.exit_code == 1


def test_background_server_is_reachable_by_exec(sb, term):
    port = 8701 if "notmux" in sb.spec.image else 8702
    assert term.run(f"python3 -m http.server {port} >/dev/null 2>&1 &\n", 5).done
    probe = ("python3 -c \"import sys, time, urllib.request as u\n"
             "for _ in range(100):\n"
             f"    try: print(u.urlopen('http://127.0.0.1:{port}/').status); sys.exit(0)\n"
             "    except OSError: time.sleep(0.05)\n"
             "sys.exit(3)\"")
    r = sb.exec(probe, timeout=15)
    assert r.exit_code == 0 and r.stdout.strip() == "200", r
    assert term.alive  # the exec spared the session
    assert "http.server" in term.run("jobs\n", 5).text


def test_ctrl_c_interrupts(term):
    out = term.run("sleep 100\n", 0.5)
    assert not out.done and out.alive
    out = term.run("C-c", 5)
    assert out.done and out.exit_code == 130
    assert term.run("echo after\n", 5).text.count("after") == 2  # echoed and printed


def test_interactive_prompt_is_answered(term):
    out = term.run("read -p 'name? ' n; echo hello-$n\n", 1)
    assert not out.done and out.text.endswith("name? ")
    out = term.run("bob\n", 5)
    assert out.done and "hello-bob\n" in out.text


def test_close_leaves_no_process(sb):
    t = sb.open_session()
    assert t.run("sleep 777 & (setsid sleep 778 &); nohup sleep 779 >/dev/null 2>&1 &\n",
                 5).done
    assert len(_others(sb)) >= 4  # the session's shell, tmux or not, and the sleeps
    t.close()
    assert not t.alive
    assert _others(sb) == []
    with pytest.raises(SandboxLost):
        t.send("echo hi\n")


def test_output_cap_holds(sb, term):
    out = term.run("yes | head -c 5000000\n", 20)  # 1-7 s: tmux escapes each CR LF
    assert out.done and out.truncated
    assert len(out.text.encode()) <= sb.spec.max_output_bytes + 200
    assert out.text.startswith("yes | head -c 5000000\ny\ny\n")
    assert out.text.endswith("y\ny\n~$ ") and "bytes truncated]" in out.text


# ----------------------------------------------------------------------- exec beside a session


def test_exec_spares_the_session_and_kills_its_own_group(sb, term):
    assert term.run("sleep 900 &\n", 5).done
    r = sb.exec("sleep 901 & echo started", timeout=10)
    assert r.exit_code == 0 and r.stdout == "started\n"
    left = _others(sb)
    assert any("sleep 900" in ln for ln in left) and not any("sleep 901" in ln for ln in left)
    r = sb.exec("sleep 30", timeout=0.5)
    assert r.timed_out and r.exit_code == -9
    r = sb.exec("exit 7", timeout=5)
    assert r.exit_code == 7
    sb.put_files({"note.txt": b"from the host"})
    assert sb.get_file("note.txt") == b"from the host"
    assert term.alive and "from the host" in term.run("cat note.txt; echo\n", 5).text
    assert "Running                 sleep 900 &" in term.run("jobs\n", 5).text


def test_one_session_at_a_time(sb, term):
    with pytest.raises(BadRequest, match="already has a terminal session"):
        sb.open_session()
    term.close()
    again = sb.open_session()  # a closed session makes room for the next
    try:
        assert again.run("echo ok\n", 5).done
    finally:
        again.close()


def test_closing_the_session_does_not_wait_for_an_exec(sb):
    t = sb.open_session()
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("r", sb.exec("sleep 20", timeout=30)))
    th.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    t.close()
    assert time.monotonic() - t0 < 5
    th.join(10)
    assert got["r"].exit_code == -9 and not got["r"].timed_out  # closing ended it too
    assert _others(sb) == []


def test_lifetime_bounds_cpu_time(sb):
    with sb.open_session(lifetime_s=1) as t:
        out = t.run("python3 -c 'while 1: pass'; echo rc=$?\n", 8)
        assert out.done and ("rc=137" in out.text or "rc=152" in out.text)  # KILL / XCPU
        assert t.run("echo still-here\n", 5).done


@pytest.mark.parametrize("lifetime", [0, -1, True, "10", 1e9])
def test_bad_lifetime_is_refused(tmux_sb, lifetime):
    with pytest.raises(BadRequest, match="lifetime_s"):
        tmux_sb.open_session(lifetime)


def test_closing_the_sandbox_closes_the_session(client, no_tmux_image):
    for image in (None, no_tmux_image):
        sb = _sandbox(client, image)
        t = sb.open_session()
        assert t.run("echo up\n", 5).done
        t0 = time.monotonic()
        sb.close()
        assert not t.alive and time.monotonic() - t0 < 8
        assert not client.containers.list(all=True, filters={"name": f"trsi-{sb.id}"})
