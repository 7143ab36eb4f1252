"""The Sandbox protocol, identical on every backend; plus its pure helpers."""

from __future__ import annotations

import io
import random
import tarfile

import pytest

from terminal_rsi.sandbox import (
    BadRequest,
    CommandTimeout,
    ExecResult,
    OutputCap,
    SandboxLost,
    SandboxSpec,
    open_sandbox,
)
from terminal_rsi.sandbox.base import check_tar, files_to_tar, safe_relpath


# ------------------------------------------------------------------ pure parts
@pytest.mark.parametrize("limit", [1, 2, 7, 64])
def test_output_cap_matches_reference(limit):
    rng = random.Random(limit)
    for _ in range(50):
        chunks = [bytes(rng.randrange(97, 123) for _ in range(rng.randrange(0, 40)))
                  for _ in range(rng.randrange(0, 8))]
        data = b"".join(chunks)
        cap = OutputCap(limit)
        for ch in chunks:
            cap.feed(ch)
        head_n, tail_n = limit - limit // 2, limit // 2
        if len(data) <= limit:
            assert not cap.truncated and cap.text() == data.decode()
        else:
            assert cap.truncated
            tail = data[len(data) - tail_n:] if tail_n else b""
            dropped = len(data) - head_n - tail_n
            want = (data[:head_n].decode() + f"\n...[{dropped} bytes truncated]...\n"
                    + tail.decode())
            assert cap.text() == want
        assert cap.total == len(data)


def test_output_cap_text_is_within_the_cap_in_utf8_bytes():
    for data, limit in ((b"\xff" * 4096, 4096), (b"\xe2\x82\xac" * 2000, 999),
                        (b"ok" + b"\xff" * 50_000, 1000)):
        cap = OutputCap(limit)
        cap.feed(data)
        text = cap.text()
        marker = len(text.split("\n...[")[1].split("]...\n")[0]) + 12 if "]...\n" in text else 0
        assert len(text.encode()) <= limit + marker
        assert cap.truncated == (len(data) > limit or len(data.decode("utf-8", "replace")
                                                          .encode()) > limit)
    cap = OutputCap(100)
    cap.feed("héllo €".encode())
    assert cap.text() == "héllo €" and not cap.truncated


def test_output_cap_memory_is_bounded():
    cap = OutputCap(1000)
    for _ in range(10_000):
        cap.feed(b"y" * 4096)
    assert len(cap.head) + len(cap.tail) <= 2 * 1000 + 4096
    assert cap.total == 10_000 * 4096


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "..", "../x", "a/../../x", "a\0b"])
def test_safe_relpath_rejects(bad):
    with pytest.raises(BadRequest):
        safe_relpath(bad)


def test_safe_relpath_normalizes():
    assert safe_relpath("a/./b/../c") == "a/c"
    assert safe_relpath(".") == "."


def test_check_tar_accepts_files_dirs_inner_links():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("d")
        ti.type = tarfile.DIRTYPE
        tf.addfile(ti)
        ti = tarfile.TarInfo("d/l")
        ti.type, ti.linkname = tarfile.SYMTYPE, "../f"
        tf.addfile(ti)
    assert [m.name for m in check_tar(buf.getvalue())] == ["d", "d/l"]
    with pytest.raises(BadRequest):
        check_tar(b"not a tar" * 100)


def test_spec_json_roundtrip_and_validation():
    spec = SandboxSpec(files={"a/b": b"\x00\xff"}, env={"X": "1"}, memory_mb=64)
    assert SandboxSpec.from_json(spec.to_json()) == spec
    with pytest.raises(BadRequest):
        SandboxSpec.from_json({"memroy_mb": 1})
    with pytest.raises(BadRequest):
        SandboxSpec(memory_mb=0)
    with pytest.raises(BadRequest):
        SandboxSpec(files={"../x": b""})
    for cpus in (1e-10, 0.0, float("inf"), float("nan"), True):
        with pytest.raises(BadRequest):  # Docker turns a quota under 0.01 into none at all
            SandboxSpec(cpus=cpus)


def test_exec_result_check():
    ok = ExecResult("", "", 0)
    assert ok.check() is ok and ok.ok
    with pytest.raises(CommandTimeout):
        ExecResult("", "", -9, timed_out=True, duration_s=1.0).check()
    assert ExecResult.from_json(ok.to_json()) == ok


def test_unknown_backend():
    with pytest.raises(BadRequest):
        open_sandbox(SandboxSpec(), backend="vm")


# ------------------------------------------------------------- every backend
def test_exec_env_cwd_exit_code(make_sandbox):
    sb = make_sandbox(SandboxSpec(env={"FROM_SPEC": "s"}, files={"sub/f.txt": b"seeded"}))
    r = sb.exec("echo out; echo err >&2; exit 7", timeout=10)
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.truncated) == (
        "out\n", "err\n", 7, False, False)
    r = sb.exec('echo "$FROM_SPEC $FROM_EXEC"; pwd; cat f.txt', timeout=10,
                env={"FROM_EXEC": "e"}, cwd="sub")
    lines = r.stdout.splitlines()
    assert lines[0] == "s e"
    assert lines[1].endswith("/sub") and lines[1].startswith(sb.workdir)
    assert lines[2] == "seeded"
    with pytest.raises(BadRequest):
        sb.exec("true", timeout=10, cwd="../..")
    with pytest.raises(BadRequest):
        sb.exec("true", timeout=10, cwd="no-such-dir")
    with pytest.raises(BadRequest):
        sb.exec("true", timeout=-1)


def test_state_persists_between_execs(make_sandbox):
    sb = make_sandbox()
    sb.exec("mkdir -p out && echo 42 > out/x && chmod +x out", timeout=10)
    assert sb.exec("cat out/x", timeout=10).stdout == "42\n"
    r = sb.exec('t="${TMPDIR:-/tmp}/t"; echo tmp > "$t" && cat "$t"', timeout=10)
    assert r.stdout == "tmp\n"


def test_timeout_flag(make_sandbox):
    sb = make_sandbox()
    r = sb.exec("echo before; sleep 30", timeout=1)
    assert r.timed_out and r.exit_code < 0 and r.stdout == "before\n"
    with pytest.raises(CommandTimeout):
        r.check()
    assert sb.exec("echo after", timeout=10).stdout == "after\n"


def test_output_truncated_head_and_tail(make_sandbox):
    sb = make_sandbox(SandboxSpec(max_output_bytes=1000))
    r = sb.exec("echo START; head -c 100000 /dev/zero | tr '\\0' m; echo; echo END", timeout=20)
    assert r.truncated and r.exit_code == 0
    assert r.stdout.startswith("START\nmmm") and r.stdout.endswith("mmm\nEND\n")
    assert "bytes truncated]" in r.stdout and len(r.stdout) < 1100


def test_put_get_roundtrip(make_sandbox):
    sb = make_sandbox()
    payload = bytes(range(256)) * 50
    sb.put_files({"d/bin.dat": payload, "d/e/t.txt": b"text"})
    assert sb.get_file("d/bin.dat") == payload
    assert sb.exec("cat d/e/t.txt; stat -c %s d/bin.dat", timeout=10).stdout == "text12800\n"
    with tarfile.open(fileobj=io.BytesIO(sb.get_tar("d")), mode="r") as tf:
        names = sorted(m.name for m in tf.getmembers())
    assert names == ["d", "d/bin.dat", "d/e", "d/e/t.txt"]
    sb.put_tar(files_to_tar({"x.sh": b"#!/bin/sh\necho ran\n"}, mode=0o755), dest="tools")
    assert sb.exec("./tools/x.sh", timeout=10).stdout == "ran\n"
    sb.exec("echo made > made.txt", timeout=10)
    assert sb.get_file("made.txt") == b"made\n"
    with pytest.raises(BadRequest):
        sb.get_file("missing.txt")
    with pytest.raises(BadRequest):
        sb.get_tar("d", max_bytes=100)


def test_close_is_idempotent_and_final(make_sandbox):
    sb = make_sandbox()
    sb.close()
    sb.close()
    with pytest.raises(SandboxLost):
        sb.exec("true", timeout=5)


def test_context_manager_cleans_up(make_sandbox):
    from .conftest import assert_no_leftovers

    with make_sandbox() as sb:
        sb.exec("sleep 30 &", timeout=5)
    assert_no_leftovers(sb.id)


def test_the_exec_env_cannot_redirect_the_machinery(make_sandbox):
    """The wrapper's own tools (setpriv, bwrap) come from the host's PATH, never the exec's."""
    sb = make_sandbox()
    r = sb.exec("echo ran", timeout=10, env={"PATH": "", "BASH_ENV": "/nonexistent"})
    assert (r.exit_code, r.stdout) == (0, "ran\n")
    with pytest.raises(BadRequest):
        SandboxSpec(files={".": b"x"})


def test_binary_output_stays_within_the_cap_as_text(make_sandbox):
    """Invalid UTF-8 decodes to U+FFFD (3 bytes each): the text is cut to the cap, not 3x it."""
    sb = make_sandbox(SandboxSpec(max_output_bytes=4096))
    r = sb.exec("head -c 4096 /dev/zero | tr '\\0' '\\377'; head -c 9000 /dev/zero | "
                "tr '\\0' '\\377' >&2", timeout=20)
    assert len(r.stdout.encode()) <= 4096 and len(r.stderr.encode()) <= 4096 + 64
    assert r.truncated and r.stdout.startswith("\ufffd")
