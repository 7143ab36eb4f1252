"""Workspace file operations (`terminal_rsi.sandbox.fsops`) against a hostile workspace.

No sandbox is started: the workspace is a plain directory that the test fills the way
an agent would (planted links, link chains, FIFOs, sockets), and an "outside" directory
beside it must stay untouched whatever the upload says.
"""

from __future__ import annotations

import os
import random
import socket

import pytest

from terminal_rsi.sandbox import BadRequest
from terminal_rsi.sandbox.base import TarLimits, files_to_tar
from terminal_rsi.sandbox.fsops import extract, fs_identity, is_dir, pack

from .conftest import make_tar, tar_members

ROOT = os.geteuid() == 0


@pytest.fixture
def dirs(tmp_path):
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return str(ws), str(outside)


def _snapshot(path: str) -> dict[str, bytes]:
    out = {}
    for dp, _, fns in os.walk(path):
        for fn in fns:
            p = os.path.join(dp, fn)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = f.read()
    return out


def test_roundtrip_files_dirs_and_links_of_any_target(dirs):
    ws, _ = dirs
    n = extract(ws, make_tar([("d", "dir", None), ("d/a.txt", "file", b"alpha"),
                          ("py", "sym", "/usr/bin/python3"), ("d/up", "sym", "../..")]))
    assert n == 4
    assert open(os.path.join(ws, "d/a.txt"), "rb").read() == b"alpha"
    assert os.stat(os.path.join(ws, "d/a.txt")).st_mode & 0o777 == 0o640
    assert os.readlink(os.path.join(ws, "py")) == "/usr/bin/python3"
    got = tar_members(pack(ws, "."))
    assert set(got) == {".", "d", "d/a.txt", "py", "d/up"}
    assert got["py"].issym() and got["py"].linkname == "/usr/bin/python3"
    assert got["d/a.txt"].isreg() and got["d/a.txt"].size == 5
    sub = tar_members(pack(ws, "d"))
    assert set(sub) == {"d", "d/a.txt", "d/up"}


def test_upload_through_a_planted_directory_link_is_refused(dirs):
    ws, outside = dirs
    os.symlink(outside, os.path.join(ws, "out"))
    before = _snapshot(outside)
    for data, dest in ((files_to_tar({"out/evil.txt": b"pwned"}), "."),
                       (files_to_tar({"evil.txt": b"pwned"}), "out"),
                       (files_to_tar({"evil.txt": b"pwned"}), "out/sub")):
        with pytest.raises(BadRequest, match="symlink"):
            extract(ws, data, dest)
    assert _snapshot(outside) == before


def test_upload_over_a_planted_file_link_replaces_the_link(dirs):
    ws, outside = dirs
    os.symlink(os.path.join(outside, "secret.txt"), os.path.join(ws, "f"))
    extract(ws, files_to_tar({"f": b"mine"}))
    assert not os.path.islink(os.path.join(ws, "f"))
    assert open(os.path.join(ws, "f"), "rb").read() == b"mine"
    assert open(os.path.join(outside, "secret.txt")).read() == "secret"


def test_link_member_then_member_through_it_is_refused(dirs):
    ws, outside = dirs
    with pytest.raises(BadRequest, match="link"):
        extract(ws, make_tar([("l", "sym", outside), ("l/evil.txt", "file", b"x")]))
    assert not os.path.exists(os.path.join(outside, "evil.txt"))


def _pathmax_chain(ws: str, outside: str) -> str:
    """A chain of links whose resolved length passes PATH_MAX, ending outside the workspace."""
    name = "d" * 200
    cur = ws
    for _ in range(12):
        cur = os.path.join(cur, name)
        os.mkdir(cur)
    os.symlink(os.path.relpath(cur, ws), os.path.join(ws, "deep"))
    prev = "deep"
    for i in range(30):
        os.symlink(f"{prev}/" + "/".join([".."] * 12) + f"/{'deep'}", os.path.join(ws, f"c{i}"))
        prev = f"c{i}"
    os.symlink(outside, os.path.join(ws, "exit"))
    return prev


def test_pathmax_link_chain_neither_escapes_nor_raises_oserror(dirs):
    ws, outside = dirs
    last = _pathmax_chain(ws, outside)
    before = _snapshot(outside)
    for data, dest in ((files_to_tar({f"{last}/exit/evil.txt": b"pwned"}), "."),
                       (files_to_tar({"evil.txt": b"pwned"}), last)):
        with pytest.raises(BadRequest):
            extract(ws, data, dest)
    assert _snapshot(outside) == before
    with pytest.raises(BadRequest):
        pack(ws, f"{last}/exit/secret.txt")
    got = tar_members(pack(ws, "."))  # the chain comes out as links, nothing followed
    assert got[last].issym() and got["exit"].linkname == outside
    assert not any(b"secret" in m.name.encode() for m in got.values())


def test_special_files_are_skipped_on_the_way_out(dirs):
    ws, _ = dirs
    os.mkfifo(os.path.join(ws, "fifo"))
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(ws, "sock"))
    try:
        open(os.path.join(ws, "ok.txt"), "w").write("ok")
        got = tar_members(pack(ws, "."))  # a FIFO with no writer must not block the read
    finally:
        s.close()
    assert set(got) == {".", "ok.txt"}


@pytest.mark.parametrize("members,match", [
    ([("hl", "hard", "/etc/passwd")], "hard link"),
    ([("p", "fifo", None)], "special file"),
    ([("../x", "file", b"x")], "leaves the workspace"),
    ([("/abs", "file", b"x")], "absolute"),
])
def test_bad_members_are_refused_before_any_write(dirs, members, match):
    ws, _ = dirs
    with pytest.raises(BadRequest, match=match):
        extract(ws, make_tar([("first.txt", "file", b"1"), *members]))
    assert os.listdir(ws) == []  # checked before anything was written


def test_caps_are_checked_while_streaming(dirs):
    ws, _ = dirs
    many = make_tar([(f"f{i}", "file", b"") for i in range(50)])
    with pytest.raises(BadRequest, match="more than 20 members"):
        extract(ws, many, limits=TarLimits(max_members=20))
    big = files_to_tar({"a": b"x" * 4000, "b": b"y" * 4000})
    with pytest.raises(BadRequest, match="more than 5000 bytes"):
        extract(ws, big, limits=TarLimits(max_bytes=5000))
    assert os.listdir(ws) == []
    # a download counts the stream (headers included), not only the file sizes
    for i in range(300):
        open(os.path.join(ws, f"e{i}"), "w").close()
    with pytest.raises(BadRequest, match="max_bytes"):
        pack(ws, ".", limits=TarLimits(max_bytes=64 << 10))
    assert len(pack(ws, ".", limits=TarLimits(max_bytes=1 << 20))) <= 1 << 20


def test_a_directory_in_the_way_and_missing_paths(dirs):
    ws, _ = dirs
    os.mkdir(os.path.join(ws, "x"))
    with pytest.raises(BadRequest, match="directory"):
        extract(ws, files_to_tar({"x": b"file over dir"}))
    with pytest.raises(BadRequest, match="does not exist"):
        pack(ws, "nope")
    assert is_dir(ws, "x") and not is_dir(ws, "nope") and is_dir(ws, ".")
    os.symlink("x", os.path.join(ws, "lx"))
    assert not is_dir(ws, "lx")


def test_garbage_is_a_bad_request_never_an_oserror(dirs):
    ws, _ = dirs
    rng = random.Random(0)
    good = files_to_tar({"a/b.txt": b"hello" * 100})
    for _ in range(200):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            extract(ws, bytes(data[: rng.randrange(len(data) + 1)]))
        except BadRequest:
            pass


@pytest.mark.skipif(not ROOT, reason="filesystem identity changes need root")
def test_operations_run_with_the_sandbox_uid(dirs):
    ws, outside = dirs
    uid = 2_999_123
    os.chown(ws, uid, uid)
    extract(ws, files_to_tar({"mine/f.txt": b"x"}), uid=uid)
    st = os.stat(os.path.join(ws, "mine/f.txt"))
    assert (st.st_uid, st.st_gid) == (uid, uid)
    # a root-owned 0700 directory inside the workspace is as closed to it as to the agent
    locked = os.path.join(ws, "locked")
    os.mkdir(locked, 0o700)
    with pytest.raises(BadRequest):
        extract(ws, files_to_tar({"locked/f": b"x"}), uid=uid)
    with fs_identity(uid):
        with pytest.raises(PermissionError):
            open(os.path.join(outside, "new.txt"), "w")
    open(os.path.join(outside, "new.txt"), "w").close()  # this thread is root again


def test_deep_trees_are_walked_without_recursion_and_capped(dirs):
    from terminal_rsi.sandbox.fsops import MAX_DEPTH

    ws, _ = dirs
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    for depth, name in ((MAX_DEPTH - 2, "ok"), (MAX_DEPTH + 300, "deep")):
        cur = os.dup(fd)
        for i in range(depth):
            os.mkdir(name if i == 0 else "a", dir_fd=cur)
            nxt = os.open(name if i == 0 else "a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.close(cur)
    os.close(fd)
    got = tar_members(pack(ws, "ok"))
    assert len(got) == MAX_DEPTH - 2
    with pytest.raises(BadRequest, match="deeper than"):
        pack(ws, ".")
    os.chmod(os.path.join(ws, "ok"), 0)
    if not ROOT:
        assert "ok" in tar_members(pack(ws, "ok"))  # unreadable: archived, empty
