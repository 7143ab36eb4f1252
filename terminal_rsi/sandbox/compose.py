"""Multi-container sandboxes: a task's services started by the real `docker compose`.

A Terminal-Bench or Harbor task whose compose file declares services beside the agent's
(a database, an API the agent must query) runs as one compose project per sandbox::

    sb = open_compose_sandbox(spec, "client", [ComposeService("inventory", image=tag, ...)])
    sb.exec("curl http://inventory:8080/health")     # a DockerSandbox in the agent's service

The project is generated here from images already built (`image.build_context_image`), so
compose builds nothing and pulls nothing (`--pull never`), and only what is listed below
reaches the engine; the task's own compose keys never do (no host mounts, no privileged
mode, no published ports). What holds:

Network
    every service shares the network namespace of one holder container (`NET_SERVICE`):
    loopback only (``spec.network``: the host's, as for single containers). Services reach
    each other by name: the holder's /etc/hosts, which every service of the namespace sees,
    maps every service name to 127.0.0.1. Unlike compose's own bridge network, nothing on
    the host is reachable (a bridge without the engine's iptables rules lets a container
    reach every host address on it); the price is one port space for all services.
Limits and privileges
    each container gets profile "image"'s hardening (``cap_drop: ALL`` plus `IMAGE_CAPS`,
    no-new-privileges, memory = memory+swap = ``spec.memory_mb``, ``spec.pids``,
    ``spec.cpus``, nofile and core ulimits, no logs) and the sandbox's owner labels, so
    `docker_backend.sweep_stale` removes a dead owner's project too.
Start order
    the agent's service starts after every other service is started, or healthy when it
    declares a healthcheck (compose's ``depends_on`` conditions); ``up --wait`` bounds the
    whole start by ``start_timeout_s``. A service that fails to start or get healthy is a
    BadRequest naming it, with the tail of its log; nothing of the project is left.
The agent's service
    runs our pid 1 (`docker_backend.INIT_ARGV`) as the image's USER in its WORKDIR (or
    ``spec.workdir``) and is driven as any profile "image" sandbox (exec, transfers,
    terminal session). Closing the sandbox runs ``docker compose down`` for the project.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence

from terminal_rsi.sandbox import procs
from terminal_rsi.sandbox.base import SandboxSpec, check_env
from terminal_rsi.sandbox.docker_backend import (
    IMAGE_CAPS,
    INIT_ARGV,
    LABEL,
    ROOT,
    ContainerBox,
    DockerSandbox,
    docker_client,
    image_user_and_workdir,
)
from terminal_rsi.sandbox.errors import BadRequest, InfrastructureError

log = logging.getLogger(__name__)

NET_SERVICE = "trsi-net"  # the holder of the project's network namespace
COMPOSE_LABEL = "com.docker.compose.project"
HEALTHCHECK_KEYS = ("test", "interval", "timeout", "retries", "start_period", "disable")
_LOG_TAIL = 3000


@dataclasses.dataclass(frozen=True)
class ComposeService:
    """A service beside the agent's: an image present on the engine, how it runs.

    command / entrypoint: None keeps the image's; workdir "" the image's; healthcheck: a
    compose healthcheck mapping (`HEALTHCHECK_KEYS`), None for none.
    """

    name: str
    image: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    workdir: str = ""
    healthcheck: Mapping | None = None

    def __post_init__(self):
        if not _service_name_ok(self.name) or self.name == NET_SERVICE:
            raise BadRequest(f"compose service name {self.name!r}: use [a-z0-9][a-z0-9_.-]* "
                             f"(and not {NET_SERVICE!r}, which the sandbox uses)")
        check_env(dict(self.env), f"services.{self.name}.environment")
        for key in ("command", "entrypoint"):
            words = getattr(self, key)
            if words is not None and not (isinstance(words, tuple)
                                          and all(isinstance(w, str) for w in words)):
                raise BadRequest(f"services.{self.name}.{key}: expected a tuple of strings")
        if self.healthcheck is not None:
            unknown = set(self.healthcheck) - set(HEALTHCHECK_KEYS)
            if unknown:
                raise BadRequest(f"services.{self.name}.healthcheck: unknown keys "
                                 f"{sorted(unknown)}; known: {list(HEALTHCHECK_KEYS)}")

    @property
    def has_healthcheck(self) -> bool:
        return bool(self.healthcheck) and not self.healthcheck.get("disable", False)


def _service_name_ok(name: object) -> bool:
    return (isinstance(name, str) and 0 < len(name) <= 63 and name[0].isalnum()
            and name.isascii() and name == name.lower()
            and all(c.isalnum() or c in "_.-" for c in name))


def _hardening(spec: SandboxSpec, sid: str) -> dict:
    """What every container of the project gets (profile "image"'s create() arguments)."""
    labels = {LABEL: sid, **{f"{LABEL}.{k}": v for k, v in procs.owner_identity().items()}}
    return {"cap_drop": ["ALL"], "cap_add": list(IMAGE_CAPS),
            "security_opt": ["no-new-privileges:true"], "mem_limit": f"{spec.memory_mb}m",
            "memswap_limit": f"{spec.memory_mb}m", "pids_limit": spec.pids,
            "cpus": spec.cpus, "ipc": "private", "init": False, "stop_signal": "SIGKILL",
            "ulimits": {"nofile": {"soft": spec.open_files, "hard": spec.open_files},
                        "core": {"soft": 0, "hard": 0}},
            "labels": labels, "logging": {"driver": "none"}}


def compose_document(spec: SandboxSpec, agent: str, services: Sequence[ComposeService],
                     sid: str, *, client=None) -> dict:
    """The compose project of a sandbox (see the module doc): the holder of the network
    namespace, the other services, then the agent's service from ``spec.image``."""
    if not _service_name_ok(agent) or agent == NET_SERVICE:
        raise BadRequest(f"agent service name {agent!r}: use [a-z0-9][a-z0-9_.-]*")
    names = [s.name for s in services]
    if agent in names or len(set(names)) != len(names):
        raise BadRequest(f"compose services {names} repeat a name (the agent's is {agent!r})")
    client = client or docker_client()
    user, workdir = image_user_and_workdir(client, spec)
    hard = _hardening(spec, sid)
    net = f"service:{NET_SERVICE}"
    doc: dict = {"services": {NET_SERVICE: {
        **hard, "image": spec.image, "entrypoint": INIT_ARGV[:1], "command": INIT_ARGV[1:],
        "user": ROOT, "network_mode": "host" if spec.network else "none",
        "extra_hosts": [f"{n}:127.0.0.1" for n in (agent, *names)], "mem_limit": "64m",
        "memswap_limit": "64m", "pids_limit": 16}}}
    for s in services:
        svc = {**hard, "image": s.image, "network_mode": net, "environment": dict(s.env),
               "depends_on": [NET_SERVICE]}
        for key, value in (("command", s.command), ("entrypoint", s.entrypoint)):
            if value is not None:
                svc[key] = list(value)
        if s.workdir:
            svc["working_dir"] = s.workdir
        if s.healthcheck:
            svc["healthcheck"] = dict(s.healthcheck)
        doc["services"][s.name] = svc
    depends = {NET_SERVICE: {"condition": "service_started"}}
    depends.update({s.name: {"condition": "service_healthy" if s.has_healthcheck
                             else "service_started"} for s in services})
    doc["services"][agent] = {
        **hard, "image": spec.image, "entrypoint": INIT_ARGV[:1], "command": INIT_ARGV[1:],
        "user": user, "working_dir": workdir, "network_mode": net,
        "environment": dict(spec.env), "depends_on": depends}
    return doc


class _ComposeBox(ContainerBox):
    """The agent's container of a compose project; destroying it takes the project down."""

    def __init__(self, container, project: str, workdir: str):
        super().__init__(container, "")
        self.project, self.dir = project, workdir

    def destroy(self) -> None:
        if not _down(self.project, self.dir):
            super().destroy()


def _down(project: str, workdir: str) -> bool:
    """Take the project down and remove its files; whether compose could."""
    try:
        _compose(project, workdir, ["down", "--volumes", "--remove-orphans", "--timeout", "0"],
                 timeout=120)
        return True
    except (InfrastructureError, BadRequest) as e:
        log.warning("docker compose down of %s failed: %s", project, e)
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _compose(project: str, workdir: str, args: list[str], *, timeout: float) -> str:
    """Run `docker compose` for the project (its file in `workdir`); its output."""
    exe = shutil.which("docker")
    if exe is None:
        raise InfrastructureError("no docker CLI on PATH: install docker.io, docker-cli and "
                                  "docker-compose (see .ci/setup_sandbox.sh)")
    argv = [exe, "compose", "-p", project, "-f", os.path.join(workdir, "compose.json"),
            "--project-directory", workdir, "--ansi", "never", *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise BadRequest(f"docker compose {args[0]} of {project} ran past {timeout:g} s"
                         ) from e
    out = (proc.stdout + proc.stderr)[-_LOG_TAIL:]
    if proc.returncode != 0:
        if "is not a docker command" in out or "unknown command" in out:
            raise InfrastructureError("`docker compose` is missing: install Debian's "
                                      "docker-compose package (see .ci/setup_sandbox.sh)")
        raise BadRequest(f"docker compose {args[0]} of {project} failed "
                         f"({proc.returncode}): {out}")
    return out


def _start_failure(project: str, workdir: str, e: BadRequest) -> BadRequest:
    """The start's error with the services' log tails (logging is off: `ps` states)."""
    try:
        states = _compose(project, workdir, ["ps", "--all", "--format",
                                             "{{.Service}}: {{.State}} {{.Status}}"],
                          timeout=60)
    except (InfrastructureError, BadRequest):
        states = ""
    return BadRequest(f"{e}\nservices: {states.strip()}")


def open_compose_sandbox(spec: SandboxSpec, agent: str, services: Sequence[ComposeService],
                         *, client=None, start_timeout_s: float = 120.0) -> DockerSandbox:
    """Start the project (module doc) and return the agent's service as a DockerSandbox of
    profile "image"; ``spec.image`` is the agent's image."""
    if spec.profile != "image":
        raise BadRequest("a compose sandbox runs task images: give a spec of profile 'image'")
    client = client or docker_client()
    sid = uuid.uuid4().hex[:16]
    project = f"trsi-{sid}"
    doc = compose_document(spec, agent, services, sid, client=client)
    workdir = tempfile.mkdtemp(prefix=f"{project}-")
    with open(os.path.join(workdir, "compose.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    try:
        try:
            _compose(project, workdir, ["up", "--detach", "--wait", "--wait-timeout",
                                        str(int(start_timeout_s)), "--pull", "never",
                                        "--no-build", "--quiet-pull"],
                     timeout=start_timeout_s + 60)
        except BadRequest as e:
            raise _start_failure(project, workdir, e) from e
        found = client.containers.list(filters={"label": [
            f"{COMPOSE_LABEL}={project}", f"com.docker.compose.service={agent}"]})
        if len(found) != 1:
            raise InfrastructureError(f"compose project {project}: expected one container of "
                                      f"the service {agent!r}, found {len(found)}")
        box = _ComposeBox(found[0], project, workdir)
    except BaseException:
        _down(project, workdir)
        raise
    return DockerSandbox(spec, client=client, box=box)
