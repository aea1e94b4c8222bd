"""The files under deploy/ and docs/deploying.md: the page shows each file verbatim, the YAML
parses, stop timeouts exceed the Worker's grace, and every ``delayq`` command they run exists
with the flags they pass."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest

from delayq import Worker
from delayq.cli.main import main
from delayq.worker.health import STALE_S

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PAGE = ROOT / "docs" / "deploying.md"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```$", re.S | re.M)
GRACE = inspect.signature(Worker.__init__).parameters["grace"].default


def deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def page_blocks() -> list[str]:
    return FENCE.findall(PAGE.read_text())


def included() -> dict[str, str]:
    """The page's code blocks that are files: their first line is ``# deploy/<path>``."""
    out = {}
    for block in page_blocks():
        first = block.split("\n", 1)[0]
        if first.startswith("# deploy/"):
            out[first[2:].strip()] = block
    return out


def yaml_docs(path: Path) -> list[Any]:
    yaml = pytest.importorskip("yaml")
    return list(yaml.safe_load_all(path.read_text()))


def _has_yaml() -> bool:
    return importlib.util.find_spec("yaml") is not None


def _unit(path: Path) -> dict[str, str]:
    out = {}
    for ln in path.read_text().splitlines():
        if "=" in ln and not ln.startswith(("#", "[")):
            key, value = ln.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list)
    return [str(v) for v in value]


def _seconds(text: str | int) -> float:
    if isinstance(text, int):
        return float(text)
    m = re.fullmatch(r"(\d+)(s|m)", text)
    assert m, text
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def test_deploy_holds_the_expected_files() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in deploy_files()}
    assert {
        "deploy/systemd/delayq-worker.service",
        "deploy/docker/Dockerfile",
        "deploy/docker/compose.yaml",
        "deploy/kubernetes/worker.yaml",
    } <= names


@pytest.mark.parametrize("path", deploy_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_file_names_itself_and_the_page_shows_it_verbatim(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    text = path.read_text()
    assert text.split("\n", 1)[0] == f"# {name}", "a file's first line names it"
    blocks = included()
    assert name in blocks, f"docs/deploying.md does not include {name}"
    assert blocks[name] == text, f"docs/deploying.md's copy of {name} differs from the file"


def test_the_page_includes_no_file_that_is_missing() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in deploy_files()}
    assert set(included()) <= names


def test_compose_runs_valkey_with_aof_and_noeviction() -> None:
    (doc,) = yaml_docs(DEPLOY / "docker" / "compose.yaml")
    valkey = doc["services"]["valkey"]["command"]
    pairs = dict(zip(valkey[1::2], valkey[2::2], strict=True))
    assert valkey[0] == "valkey-server"
    assert pairs["--appendonly"] == "yes"
    assert pairs["--maxmemory-policy"] == "noeviction"
    worker = doc["services"]["worker"]
    assert worker["stop_signal"] == "SIGTERM"
    assert _seconds(worker["stop_grace_period"]) > GRACE + 10
    assert worker["environment"]["DELAYQ_REDIS_URL"].startswith("redis://valkey:")


def kubernetes() -> dict[str, Any]:
    """The manifest's documents by kind."""
    docs = yaml_docs(DEPLOY / "kubernetes" / "worker.yaml")
    return {d["kind"]: d for d in docs}


def test_kubernetes_gives_more_than_grace_and_probes_the_metrics_port() -> None:
    k8s = kubernetes()
    doc = k8s["Deployment"]
    pod = doc["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > GRACE + 10
    (container,) = pod["containers"]
    command = container["command"]
    port = int(command[command.index("--metrics-port") + 1])
    assert command[command.index("--metrics-host") + 1] == "0.0.0.0"  # the kubelet reaches it
    (named,) = container["ports"]
    assert named["containerPort"] == port
    # The worker's own probes, not `delayq check` on the queue: a backlog fails neither.
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert "exec" not in container[probe], probe
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] in (port, named["name"])
    # Liveness gives a stuck loop more than the pulse's staleness bound before a restart.
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= STALE_S


def test_kubernetes_runs_unprivileged_on_a_read_only_root_with_a_disruption_budget() -> None:
    k8s = kubernetes()
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # A numeric user, as runAsNonRoot needs to verify it: the Dockerfile's.
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert f"--uid {pod['securityContext']['runAsUser']} app" in dockerfile
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    # --processes keeps its children's metrics and pulses under /tmp: writable.
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    assert {v["name"]: v for v in pod["volumes"]}[mount["name"]] == {
        "name": mount["name"],
        "emptyDir": {},
    }
    pdb = k8s["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1"
    labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    assert pdb["spec"]["maxUnavailable"] == 1


def test_compose_checks_the_workers_readyz() -> None:
    (doc,) = yaml_docs(DEPLOY / "docker" / "compose.yaml")
    test = doc["services"]["worker"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    cmd = next(
        ln
        for ln in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines()
        if ln.startswith("CMD ")
    )
    argv = _json_list(cmd[4:])
    port = argv[argv.index("--metrics-port") + 1]
    assert f"http://127.0.0.1:{port}/readyz" in test[3]
    assert "delayq" not in test  # not `delayq check`: that is for alerting


def test_systemd_unit_restarts_on_failure_and_stops_after_grace() -> None:
    unit = _unit(DEPLOY / "systemd" / "delayq-worker.service")
    assert unit["Restart"] == "on-failure"
    assert unit["KillSignal"] == "SIGTERM"
    assert int(unit["TimeoutStopSec"]) > GRACE + 10
    assert "delayq worker myapp.tasks:worker" in unit["ExecStart"]


def test_dockerfile_runs_the_worker_in_exec_form() -> None:
    cmd = next(
        ln
        for ln in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines()
        if ln.startswith("CMD ")
    )
    assert cmd[4:].lstrip().startswith('["delayq", "worker"')


def delayq_commands() -> list[tuple[str, list[str]]]:
    """Every delayq command line the files and the page run, as (where, argv after 'delayq')."""
    found: list[tuple[str, list[str]]] = []

    def add(where: str, argv: list[str]) -> None:
        for i, word in enumerate(argv):
            if word == "delayq" or word.endswith("/delayq"):
                found.append((where, argv[i + 1 :]))
                return

    unit = _unit(DEPLOY / "systemd" / "delayq-worker.service")
    add("systemd ExecStart", shlex.split(unit["ExecStart"]))
    for ln in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines():
        if ln.startswith("CMD "):
            add("Dockerfile CMD", _json_list(ln[4:]))
    if _has_yaml():
        (compose,) = yaml_docs(DEPLOY / "docker" / "compose.yaml")
        for name, svc in compose["services"].items():
            test = svc.get("healthcheck", {}).get("test")
            if test and test[0] == "CMD":
                add(f"compose {name} healthcheck", test[1:])
        k8s = kubernetes()["Deployment"]
        for c in k8s["spec"]["template"]["spec"]["containers"]:
            add("kubernetes command", c["command"])
    # Commands shown in the page's own text and shell blocks.
    text = PAGE.read_text()
    for m in re.finditer(r"`(delayq [^`]+)`", text):
        add("docs/deploying.md", shlex.split(m.group(1).replace("…", "").strip()))
    return found


def test_the_files_run_delayq_commands() -> None:
    wheres = {w for w, _ in delayq_commands()}
    assert {"systemd ExecStart", "Dockerfile CMD"} <= wheres
    if _has_yaml():
        assert "kubernetes command" in wheres


@pytest.mark.parametrize("where,argv", delayq_commands(), ids=lambda v: str(v))
def test_every_command_exists_with_its_flags(where: str, argv: list[str]) -> None:
    """click parses each command line without running it: an unknown command or flag, or a
    bad value, fails. A command the page only names (`delayq worker`) may leave out its
    required arguments; the files' commands are complete."""
    ctx = click.Context(main, info_name="delayq")
    cmd: click.Command = main
    args = list(argv)
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        name = args.pop(0)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"{where}: no command {name!r} in `delayq {' '.join(argv)}`"
        if isinstance(sub, click.Group):
            cmd, ctx = sub, click.Context(sub, info_name=name, parent=ctx)
            continue
        try:
            sub.make_context(name, args, parent=ctx)
        except click.MissingParameter:
            if not where.startswith("docs/"):
                raise
        except click.UsageError as e:
            pytest.fail(f"{where}: `delayq {' '.join(argv)}`: {e.format_message()}")
        return
    assert not args, f"{where}: `delayq {' '.join(argv)}` names no command"
