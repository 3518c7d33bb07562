"""`kubectl noisyneighbor`: run `top` or `diagnose` in the agent pod of a given node.

    kubectl noisyneighbor top NODE [top options]
    kubectl noisyneighbor diagnose NODE [--duration 2m] [--html report.html] [diagnose options]

kubectl finds this as ``kubectl-noisyneighbor`` on PATH (installed with the package). It looks the
agent pod up by node (``spec.nodeName``) and label, then ``kubectl exec``s the CLI there with the flags
the container needs (``--host-root /host``; diagnose also reads the cluster's policy from the mounted
ConfigMap), streaming its output. ``--html FILE`` is written in the pod's /tmp and copied back, then
removed. Everything goes through the user's kubectl (its kubeconfig, context and credential plugins);
the exit code is the remote command's (diagnose: 0 clean, 3 incidents with --fail-on-incident), or 1
with one line on stderr when no agent pod runs on the node.

The command runs inside the agent's container, next to the agent, and loads its own probes: it counts
against the container's memory limit while it runs (see deploy/README.md, "Sizing").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NAMESPACE = "noisyneighbor"
DEFAULT_SELECTOR = "app.kubernetes.io/name=noisyneighbor,app.kubernetes.io/component=agent"
DEFAULT_CONTAINER = "agent"
HOST_ROOT = "/host"  # where the DaemonSet mounts the host's /proc and /sys (deploy/base/daemonset.yaml)
CLUSTER_CONFIG = "/etc/noisyneighbor/config.yaml"  # the ConfigMap mount: the cluster's SLOs for diagnose
REMOTE_TMP = "/tmp"  # the container's writable emptyDir (its root filesystem is read-only)


class PluginError(Exception):
    """One line for stderr; exit 1."""


@dataclass(frozen=True)
class Kubectl:
    """The user's kubectl with the connection flags they gave the plugin."""

    binary: str
    kubeconfig: str | None = None
    context: str | None = None

    def base(self) -> list[str]:
        cmd = [self.binary]
        if self.kubeconfig:
            cmd += ["--kubeconfig", self.kubeconfig]
        if self.context:
            cmd += ["--context", self.context]
        return cmd

    def agent_pod(self, node: str, namespace: str, selector: str) -> str:
        cmd = [*self.base(), "get", "pods", "-n", namespace, "-l", selector,
               "--field-selector", f"spec.nodeName={node}", "-o", "json"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            # kubectl's last line is its verdict ("Error from server ...", "Unable to connect ..."); the
            # lines before it repeat the retries.
            last = next((ln.strip() for ln in reversed(res.stderr.splitlines()) if ln.strip()), "")
            raise PluginError(f"cannot list pods: {last or f'kubectl exited {res.returncode}'}")
        try:
            items = json.loads(res.stdout).get("items", [])
        except ValueError:
            raise PluginError("kubectl get pods did not return JSON") from None
        running = [p for p in items if p.get("status", {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        if not running:
            state = f" ({', '.join(p['metadata']['name'] + ': ' + p.get('status', {}).get('phase', '?') for p in items)})" \
                if items else ""
            raise PluginError(f"no running noisyneighbor agent pod on node {node} (namespace {namespace}, "
                              f"selector {selector}){state}: kubectl -n {namespace} get pods -o wide")
        return running[0]["metadata"]["name"]

    def exec(self, namespace: str, pod: str, container: str, command: list[str], *, stdin: bool = False,
             tty: bool = False, stdout=None) -> int:
        flags = ["-i"] * stdin + ["-t"] * tty
        cmd = [*self.base(), "exec", "-n", namespace, pod, "-c", container, *flags, "--", *command]
        return subprocess.run(cmd, stdout=stdout).returncode


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl noisyneighbor", allow_abbrev=False,
        description="Run noisyneighbor top or diagnose in the agent pod on NODE; the output streams here.",
        epilog="Options after NODE go to the remote command (see `noisyneighbor top --help`, `diagnose --help`).",
    )
    # kubectl users put -n and --context anywhere: accepted before and after the subcommand.
    connection = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for parser, default in ((p, None), (connection, argparse.SUPPRESS)):
        parser.add_argument("-n", "--namespace", default=default or DEFAULT_NAMESPACE,
                            help=f"the agent's namespace ({DEFAULT_NAMESPACE})")
        parser.add_argument("-l", "--selector", default=default or DEFAULT_SELECTOR, help="label selector of the agent pods")
        parser.add_argument("-c", "--container", default=default or DEFAULT_CONTAINER, help=f"container ({DEFAULT_CONTAINER})")
        parser.add_argument("--context", default=default, help="kubeconfig context")
        parser.add_argument("--kubeconfig", default=default, help="kubeconfig file")
        parser.add_argument("--kubectl", default=default, help="kubectl binary (default: kubectl on PATH)")
    sub = p.add_subparsers(dest="command", required=True)
    top = sub.add_parser("top", parents=[connection], allow_abbrev=False,
                         help="live interference on NODE (keys work on a terminal)")
    top.add_argument("node", metavar="NODE")
    diag = sub.add_parser("diagnose", parents=[connection], allow_abbrev=False,
                          help="watch NODE for a while and print the report")
    diag.add_argument("node", metavar="NODE")
    diag.add_argument("--html", metavar="FILE", help="also write the HTML report here (copied from the pod)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, remote_args = parser.parse_known_args(argv)
    binary = args.kubectl or shutil.which("kubectl")
    if binary is None:
        print("kubectl noisyneighbor: kubectl not found on PATH (or give --kubectl)", file=sys.stderr)
        return 1
    kubectl = Kubectl(binary, args.kubeconfig, args.context)
    html = Path(args.html) if getattr(args, "html", None) else None
    try:
        if html is not None:
            with open(html, "ab"):  # an unwritable path fails now, not after a long run
                pass
        pod = kubectl.agent_pod(args.node, args.namespace, args.selector)
        if args.command == "top":
            command = ["noisyneighbor", "top", "--host-root", HOST_ROOT, *remote_args]
            tty = sys.stdout.isatty()
            if tty:  # the container has no TERM: pass ours, so the live view draws for this terminal
                command = ["env", f"TERM={os.environ.get('TERM') or 'xterm'}", *command]
            return kubectl.exec(args.namespace, pod, args.container, command, stdin=sys.stdin.isatty(), tty=tty)
        return _diagnose(kubectl, args, pod, remote_args, html)
    except PluginError as e:
        print(f"kubectl noisyneighbor: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"kubectl noisyneighbor: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _diagnose(kubectl: Kubectl, args: argparse.Namespace, pod: str, remote_args: list[str], html: Path | None) -> int:
    command = ["noisyneighbor", "diagnose", "--host-root", HOST_ROOT]
    if "--config" not in remote_args:
        command += ["--config", CLUSTER_CONFIG]
    remote_html = f"{REMOTE_TMP}/noisyneighbor-report-{uuid.uuid4().hex[:12]}.html" if html else None
    if remote_html:
        command += ["--html", remote_html]
    # A terminal gets the progress line (the remote CLI draws it only on a TTY); a pipe gets the bare report.
    rc = kubectl.exec(args.namespace, pod, args.container, [*command, *remote_args], tty=sys.stdout.isatty())
    if remote_html and html is not None:
        try:
            with open(html, "wb") as out:
                copied = kubectl.exec(args.namespace, pod, args.container, ["cat", remote_html], stdout=out)
        finally:
            kubectl.exec(args.namespace, pod, args.container, ["rm", "-f", remote_html], stdout=subprocess.DEVNULL)
        if copied != 0 and rc in (0, 3):
            raise PluginError(f"could not copy the HTML report from {pod}:{remote_html}")
        if copied == 0:
            print(f"kubectl noisyneighbor: HTML report written to {html}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
