"""Multi-container sandboxes (`terminal_rsi.sandbox.compose`): services started by the real
`docker compose`, reachable by name on a loopback-only namespace, the agent's service last,
everything gone after close.

The images are built once per module from the minbase rootfs (`image.BASE_TAG`, offline).
"""

from __future__ import annotations

import json
import tempfile
import time

import pytest

from terminal_rsi.sandbox import BadRequest, SandboxSpec
from terminal_rsi.sandbox.compose import (
    COMPOSE_LABEL,
    NET_SERVICE,
    ComposeService,
    compose_document,
    open_compose_sandbox,
)
from terminal_rsi.sandbox.image import BASE_TAG, build_context_image

SERVER = ("python3", "-c", "import http.server as h; h.HTTPServer(('0.0.0.0', 8080), "
          "h.SimpleHTTPRequestHandler).serve_forever()")
FETCH = ("python3 -c \"import urllib.request as u; "
         "print(u.urlopen('http://{host}:8080/', timeout=5).status)\"")


@pytest.fixture(scope="module")
def images(client):
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/Dockerfile", "w") as f:
            f.write(f"FROM {BASE_TAG}\nWORKDIR /app\nRUN echo agent > /app/who.txt\n")
        with open(f"{d}/side.Dockerfile", "w") as f:
            f.write(f"FROM {BASE_TAG}\nWORKDIR /srv\nRUN echo side > /srv/index.html\n")
        return build_context_image(d), build_context_image(d, "side.Dockerfile")


def _project_containers(client, project: str):
    return client.containers.list(all=True, filters={"label": f"{COMPOSE_LABEL}={project}"},
                                  ignore_removed=True)


def test_services_by_name_then_gone(client, images):
    agent_img, side_img = images
    check = {"test": ["CMD-SHELL", FETCH.format(host="127.0.0.1")], "interval": "1s",
             "timeout": "5s", "retries": 30}
    spec = SandboxSpec(image=agent_img, profile="image", env={"ROLE": "agent"}, memory_mb=256)
    with open_compose_sandbox(spec, "client", [
            ComposeService("web", side_img, command=SERVER, healthcheck=check,
                           env={"ROLE": "web"})]) as sb:
        project = sb.box.project
        assert sb.workdir == "/app" and sb.exec("cat who.txt").stdout == "agent\n"
        assert sb.exec("echo $ROLE").stdout == "agent\n"
        # healthy before the agent started: the first exec already reaches it by name
        r = sb.exec(FETCH.format(host="web"))
        assert r.stdout.strip() == "200", r
        # loopback only: no interface but lo in the shared namespace
        devs = sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
        assert devs == ["lo"]
        # a session in the agent's service works as in any sandbox of profile image
        term = sb.open_session()
        out = term.run(f"{FETCH.format(host='web')}\n", 10)
        assert out.done and "200" in out.text
        names = {c.labels["com.docker.compose.service"] for c in
                 _project_containers(client, project)}
        assert names == {"client", "web", NET_SERVICE}
    assert _project_containers(client, project) == []


def test_a_service_that_never_gets_healthy_is_named(client, images):
    agent_img, side_img = images
    spec = SandboxSpec(image=agent_img, profile="image")
    t0 = time.monotonic()
    with pytest.raises(BadRequest, match="sick"):
        open_compose_sandbox(spec, "client", [ComposeService(
            "sick", side_img, command=("sleep", "600"),
            healthcheck={"test": ["CMD", "false"], "interval": "1s", "retries": 2})],
            start_timeout_s=30)
    assert time.monotonic() - t0 < 90
    # (ignore_removed: other tests' projects come and go while this lists them)
    left = client.containers.list(all=True, filters={"label": COMPOSE_LABEL},
                                  ignore_removed=True)
    assert not [c for c in left if c.labels.get(COMPOSE_LABEL, "").startswith("trsi-")
                and c.labels["com.docker.compose.service"] == "sick"]


def test_the_document_carries_only_our_keys(client, images):
    agent_img, side_img = images
    spec = SandboxSpec(image=agent_img, profile="image", memory_mb=300, pids=50)
    doc = compose_document(spec, "main", [ComposeService("db", side_img)], "abc", client=client)
    assert set(doc) == {"services"}
    for name, svc in doc["services"].items():
        assert svc["cap_drop"] == ["ALL"] and "no-new-privileges:true" in svc["security_opt"]
        assert "ports" not in svc and "volumes" not in svc and "privileged" not in svc
        if name != NET_SERVICE:
            assert svc["network_mode"] == f"service:{NET_SERVICE}"
            assert svc["mem_limit"] == "300m" and svc["pids_limit"] == 50
    assert doc["services"][NET_SERVICE]["network_mode"] == "none"
    assert doc["services"]["main"]["depends_on"]["db"] == {"condition": "service_started"}
    json.dumps(doc)  # what compose reads


@pytest.mark.parametrize("bad", [
    lambda img: ComposeService("Bad Name", img),
    lambda img: ComposeService(NET_SERVICE, img),
    lambda img: ComposeService("x", img, env={"1X": "y"}),
    lambda img: ComposeService("x", img, command=["ls"]),
    lambda img: ComposeService("x", img, healthcheck={"test": ["CMD", "true"], "bogus": 1}),
])
def test_bad_services_are_refused(bad):
    with pytest.raises(BadRequest):
        bad("img:1")


def test_profile_sandbox_is_refused():
    with pytest.raises(BadRequest, match="profile 'image'"):
        open_compose_sandbox(SandboxSpec(), "client", [])
