#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`kubectl noisyneighbor`: read `top` and `diagnose` of a node from the agent running there.

    kubectl noisyneighbor top NODE [--view V] [--once] [--json] [--interval S] [--sort K] [--limit N]
    kubectl noisyneighbor diagnose NODE [--duration 5m] [--json] [--html report.html] [--fail-on-incident]

One file, Python's standard library only (3.9 or later), so it runs wherever kubectl and a python3 do:
installed with the package (the ``kubectl-noisyneighbor`` script), or this file alone as
``kubectl-noisyneighbor`` on PATH (the krew archive, deploy/krew/). It keeps no list of views or sort
columns: the agent says which it has and their keys (``/top?format=keys``) and refuses others.

kubectl finds this as ``kubectl-noisyneighbor`` on PATH. It looks the
agent pod up by node (``spec.nodeName``) and label, then reads the agent's read-only endpoints through
the apiserver's pod proxy (``kubectl get --raw /api/v1/namespaces/NS/pods/POD:9717/proxy/top``): ``/top``
is the agent's latest interval as top shows it, ``/diagnose`` the diagnose report over the agent's own
last ``--duration`` of history. One probe set per node, the agent's: nothing is exec'd into its
container and nothing is loaded here, so a client costs the agent no memory in its cgroup (the old
`kubectl exec ... noisyneighbor top` loaded a second probe set under the agent's memory limit).
Everything goes through the user's kubectl (its kubeconfig, context and credential plugins); the user
needs ``list pods`` and ``get pods/proxy`` in the agent's namespace. Exit codes: diagnose 0 clean, 3
incidents with --fail-on-incident; 1 with one line on stderr when no agent pod runs on the node or
the agent cannot be read.

The agent answers /top and /diagnose only to a token the apiserver vouches for (``--auth kubernetes``).
The apiserver's pod proxy drops the user's own ``Authorization`` header, so the plugin asks kubectl for a
10-minute token of the ``noisyneighbor-viewer`` ServiceAccount (``kubectl create token``: the
``noisyneighbor-client`` Role in the agent's namespace allows it) or reads ``--token-file``, and sends it
in ``X-Noisyneighbor-Authorization`` through a ``kubectl proxy`` it runs on 127.0.0.1 for its lifetime (the
user's credentials stay in kubectl). Without a token it reads through ``kubectl get --raw`` (an agent
without auth).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlencode

DEFAULT_NAMESPACE = "noisyneighbor"
DEFAULT_SELECTOR = "app.kubernetes.io/name=noisyneighbor,app.kubernetes.io/component=agent"
METRICS_PORT_NAME = "metrics"  # the agent's port (deploy/base/daemonset.yaml): /metrics, /top, /diagnose
DEFAULT_PORT = 9717  # when the pod names no port "metrics"
EXIT_INCIDENTS = 3
VIEWER_SERVICE_ACCOUNT = "noisyneighbor-viewer"  # deploy/base/viewer-rbac.yaml
TOKEN_LIFETIME = "10m"
# = noisyneighbor.agent.auth.FORWARDED_TOKEN_HEADER (not imported: that package loads the agent)
TOKEN_HEADER = "X-Noisyneighbor-Authorization"
PROXY_START_S = 30.0
DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# The terminal (live top): the alternate screen with the cursor hidden, and back.
ENTER_SCREEN, LEAVE_SCREEN = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
HOME_AND_CLEAR, DIM, RESET = "\x1b[H\x1b[2J", "\x1b[2m", "\x1b[0m"


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

    def agent_pod(self, node: str, namespace: str, selector: str) -> tuple[str, int]:
        """(name, port) of the running agent pod on ``node``."""
        cmd = [*self.base(), "get", "pods", "-n", namespace, "-l", selector,
               "--field-selector", f"spec.nodeName={node}", "-o", "json"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise PluginError(f"cannot list pods: {_verdict(res.stderr, res.returncode)}")
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
        pod = running[0]
        ports = [p.get("containerPort") for c in pod.get("spec", {}).get("containers", [])
                 for p in c.get("ports", []) if p.get("name") == METRICS_PORT_NAME]
        return pod["metadata"]["name"], int(ports[0]) if ports else DEFAULT_PORT

    def create_token(self, namespace: str, service_account: str) -> tuple[str | None, str]:
        """(token, "") of the service account, or (None, kubectl's verdict) when the user may not mint one."""
        res = subprocess.run([*self.base(), "create", "token", service_account, "-n", namespace,
                              "--duration", TOKEN_LIFETIME], capture_output=True, text=True)
        if res.returncode != 0 or not res.stdout.strip():
            return None, _verdict(res.stderr, res.returncode)
        return res.stdout.strip(), ""

    def raw(self, path: str) -> bytes:
        """GET ``path`` from the apiserver (``kubectl get --raw``); the body, or PluginError with kubectl's verdict."""
        res = subprocess.run([*self.base(), "get", "--raw", path], capture_output=True)
        if res.returncode != 0:
            raise PluginError(f"cannot read the agent ({path.split('?')[0]}): "
                              f"{_verdict(res.stderr.decode(errors='replace'), res.returncode)}")
        return res.stdout


def _verdict(stderr: str, rc: int) -> str:
    """kubectl's last line is its verdict ("Error from server ...", "Unable to connect ..."); the lines
    before it repeat the retries."""
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    return last or f"kubectl exited {rc}"


@dataclass
class KubectlProxy:
    """`kubectl proxy` on a free 127.0.0.1 port: requests to the apiserver with the user's credentials, and
    the headers the plugin adds (kubectl get --raw takes none)."""

    kubectl: Kubectl
    proc: subprocess.Popen[str] | None = None
    url: str = ""

    def start(self) -> KubectlProxy:
        self.proc = subprocess.Popen([*self.kubectl.base(), "proxy", "--port=0", "--address=127.0.0.1"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], PROXY_START_S)
        line = self.proc.stdout.readline() if ready and self.proc.stdout else ""
        port = re.search(r"127\.0\.0\.1:(\d+)", line)
        if port is None:
            self.close()
            raise PluginError(f"kubectl proxy did not start: {line.strip() or 'no output'}")
        self.url = f"http://127.0.0.1:{port.group(1)}"
        return self

    def get(self, path: str, headers: dict[str, str]) -> bytes:
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, headers=headers), timeout=60) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            body = " ".join(e.read().decode(errors="replace").split())[:200]
            raise PluginError(f"cannot read the agent ({path.split('?')[0]}): HTTP {e.code}: {body}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PluginError(f"cannot read the agent through kubectl proxy: {getattr(e, 'reason', e)}") from None

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
            self.proc = None


@dataclass
class Agent:
    """The agent pod on a node, read through the apiserver's pod proxy (with a token: through kubectl proxy)."""

    kubectl: Kubectl
    namespace: str
    pod: str
    port: int
    token: str | None = None
    no_token_why: str = ""  # why there is no token, for the hint when the agent says 401
    proxy: KubectlProxy | None = field(default=None, repr=False)

    def get(self, endpoint: str, **params: object) -> bytes:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        path = (f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}:{self.port}/proxy/{endpoint}"
                + (f"?{query}" if query else ""))
        if self.token is None:
            try:
                return self.kubectl.raw(path)
            except PluginError as e:
                # The pod's 401 comes back through the proxy, and kubectl reads it as its own ("You must be
                # logged in to the server"): say that it was the agent, and why the plugin had no token.
                if any(word in str(e) for word in ("Unauthorized", "401", "logged in", "provide credentials")):
                    raise PluginError(f"the agent asks for a token (401): {self.no_token_why}") from None
                raise
        if self.proxy is None:
            self.proxy = KubectlProxy(self.kubectl).start()
        return self.proxy.get(path, {TOKEN_HEADER: f"Bearer {self.token}"})

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()


def parse_duration(text: str) -> float:
    """'30', '30s', '2m', '1.5h', '500ms' -> seconds (> 0), as `noisyneighbor` reads durations."""
    raw = text.strip().lower()
    number, scale = raw, 1.0
    for unit in sorted(DURATION_UNITS, key=len, reverse=True):
        if raw.endswith(unit):
            number, scale = raw[: -len(unit)], DURATION_UNITS[unit]
            break
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (like 30, 30s, 2m): {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl noisyneighbor", allow_abbrev=False,
        description="Read top or diagnose of NODE from the noisyneighbor agent running there (read-only).",
    )
    # kubectl users put -n and --context anywhere: accepted before and after the subcommand.
    connection = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for parser, default in ((p, None), (connection, argparse.SUPPRESS)):
        parser.add_argument("-n", "--namespace", default=default or DEFAULT_NAMESPACE,
                            help=f"the agent's namespace ({DEFAULT_NAMESPACE})")
        parser.add_argument("-l", "--selector", default=default or DEFAULT_SELECTOR, help="label selector of the agent pods")
        parser.add_argument("--context", default=default, help="kubeconfig context")
        parser.add_argument("--kubeconfig", default=default, help="kubeconfig file")
        parser.add_argument("--kubectl", default=default, help="kubectl binary (default: kubectl on PATH)")
        parser.add_argument("--token-file", default=default, metavar="FILE",
                            help="a bearer token the agent accepts (your own, with noisyneighbor-viewer bound)")
        parser.add_argument("--viewer-serviceaccount", default=default or VIEWER_SERVICE_ACCOUNT, metavar="NAME",
                            help=f"mint a {TOKEN_LIFETIME} token of this ServiceAccount with `kubectl create token` "
                                 f"(default {VIEWER_SERVICE_ACCOUNT}; '' for none)")
    sub = p.add_subparsers(dest="command", required=True)
    top = sub.add_parser("top", parents=[connection], allow_abbrev=False,
                         help="NODE's interference as the agent there measures it (live on a terminal)")
    top.add_argument("node", metavar="NODE")
    # The agent checks both and names what it has (a 400 otherwise): no list of them kept here.
    top.add_argument("--view", default="runq", help="a view of the agent's `top`, or all (default: runq)")
    top.add_argument("--sort", default="wait", help="runq's sort column (default: wait)")
    top.add_argument("--limit", type=int, metavar="N", help="show at most N rows per view")
    top.add_argument("--interval", type=parse_duration, default=1.0, metavar="S", help="read the agent every S seconds")
    top.add_argument("--once", action="store_true", help="print one interval and exit")
    top.add_argument("--json", action="store_true", help="JSON (with --once: one record; else JSON lines)")
    top.add_argument("--count", type=int, metavar="N", help="stop after N intervals")
    diag = sub.add_parser("diagnose", parents=[connection], allow_abbrev=False,
                          help="the diagnose report over the agent's own last --duration of NODE")
    diag.add_argument("node", metavar="NODE")
    diag.add_argument("--duration", type=parse_duration, default=300.0, metavar="D",
                      help="how far back (30s, 10m; default 5m, at most 1h): the agent's history, no waiting")
    diag.add_argument("--json", action="store_true", help="print the report as one JSON document")
    diag.add_argument("--html", metavar="FILE", help="also write the self-contained HTML report here")
    diag.add_argument("--fail-on-incident", action="store_true", help=f"exit {EXIT_INCIDENTS} if the window had incidents")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    binary = args.kubectl or shutil.which("kubectl")
    if binary is None:
        print("kubectl noisyneighbor: kubectl not found on PATH (or give --kubectl)", file=sys.stderr)
        return 1
    kubectl = Kubectl(binary, args.kubeconfig, args.context)
    html = Path(args.html) if getattr(args, "html", None) else None
    try:
        if html is not None:
            with open(html, "ab"):  # an unwritable path fails now, not after the request
                pass
        agent = Agent(kubectl, args.namespace, *kubectl.agent_pod(args.node, args.namespace, args.selector))
        agent.token, agent.no_token_why = _token(kubectl, args)
        try:
            if args.command == "top":
                return _top(agent, args)
            return _diagnose(agent, args, html)
        finally:
            agent.close()
    except PluginError as e:
        print(f"kubectl noisyneighbor: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"kubectl noisyneighbor: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _token(kubectl: Kubectl, args: argparse.Namespace) -> tuple[str | None, str]:
    """(token, "") for the agent, or (None, why not)."""
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
        if not token:
            raise PluginError(f"--token-file {args.token_file} is empty")
        return token, ""
    if not args.viewer_serviceaccount:
        return None, "none asked for (--viewer-serviceaccount '')"
    token, verdict = kubectl.create_token(args.namespace, args.viewer_serviceaccount)
    if token is None:
        return None, (f"kubectl create token {args.viewer_serviceaccount} failed ({verdict}): ask for the "
                      f"noisyneighbor-client Role in {args.namespace}, or give --token-file")
    return token, ""


def _top(agent: Agent, args: argparse.Namespace) -> int:
    out = sys.stdout
    params: dict[str, object] = {"view": args.view, "sort": args.sort, "limit": args.limit}
    if not args.json and not args.once and out.isatty():
        return _live_top(agent, args, params)
    shown = 0
    while args.count is None or shown < args.count:
        if shown:
            time.sleep(args.interval)
        if args.json:
            out.write(json.dumps(json.loads(agent.get("top", format="json", **params))) + "\n")
        else:
            width = shutil.get_terminal_size((160, 40)).columns
            out.write(agent.get("top", format="text", width=width, **params).decode(errors="replace"))
        out.flush()
        shown += 1
        if args.once:
            break
    return 0


@dataclass(frozen=True)
class TopKeys:
    """What the agent's `top` offers (``/top?format=keys``): key -> view, key -> sort column, the hint line."""

    view_keys: dict[str, str]
    sort_keys: dict[str, str]
    hint: str

    @classmethod
    def of(cls, agent: Agent) -> TopKeys:
        try:
            keys = json.loads(agent.get("top", format="keys"))
            return cls(dict(keys["view_keys"]), dict(keys["sort_keys"]), str(keys["hint"]))
        except (ValueError, KeyError, TypeError):
            raise PluginError("the agent's /top?format=keys is not what this plugin reads: an older agent? "
                              "use --once, or a plugin of the agent's version") from None


@contextlib.contextmanager
def cbreak(stream: TextIO) -> Iterator[bool]:
    """Single-key input on a terminal; a no-op (False) when stdin is not one."""
    if not stream.isatty():
        yield False
        return
    import termios
    import tty

    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def read_key(timeout: float) -> str | None:
    ready, _, _ = select.select([sys.stdin], [], [], max(timeout, 0))
    return os.read(sys.stdin.fileno(), 1).decode(errors="ignore") if ready else None


def _screen(body: str, hint: str, rows: int) -> str:
    """One redraw: the agent's frame (its colours) cropped to the terminal, the keys' hint dimmed below."""
    lines = body.rstrip("\n").split("\n")[: max(rows - 1, 1)]
    return HOME_AND_CLEAR + "\n".join(lines) + "\n" + DIM + hint + RESET


def _live_top(agent: Agent, args: argparse.Namespace, params: dict[str, object]) -> int:
    """On a terminal: the agent's frame redrawn every --interval; keys switch views and sort as in `top`."""
    keys_of = TopKeys.of(agent)
    out = sys.stdout
    shown = 0
    out.write(ENTER_SCREEN)
    try:
        with cbreak(sys.stdin) as keys:
            deadline = time.monotonic()
            while args.count is None or shown < args.count:
                if keys:
                    key = read_key(deadline - time.monotonic())
                else:
                    time.sleep(max(deadline - time.monotonic(), 0))
                    key = None
                if key in ("q", "Q"):
                    return 0
                if key in keys_of.sort_keys:
                    params["sort"] = keys_of.sort_keys[key]
                elif key in keys_of.view_keys:
                    params["view"] = keys_of.view_keys[key]
                elif time.monotonic() < deadline:
                    continue
                else:
                    deadline = time.monotonic() + args.interval
                    shown += 1
                size = shutil.get_terminal_size((160, 40))
                body = agent.get("top", format="text", color=1, width=size.columns, **params)
                out.write(_screen(body.decode(errors="replace"), keys_of.hint, size.lines))
                out.flush()
    finally:
        out.write(LEAVE_SCREEN)
        out.flush()
    return 0


def _diagnose(agent: Agent, args: argparse.Namespace, html: Path | None) -> int:
    report = json.loads(agent.get("diagnose", format="json", window=f"{args.duration:g}"))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(agent.get("diagnose", format="text", window=f"{args.duration:g}").decode(errors="replace"))
    sys.stdout.flush()
    if html is not None:
        html.write_bytes(agent.get("diagnose", format="html", window=f"{args.duration:g}"))
        print(f"kubectl noisyneighbor: HTML report written to {html}", file=sys.stderr)
    return EXIT_INCIDENTS if args.fail_on_incident and report.get("incidents") else 0


if __name__ == "__main__":
    sys.exit(main())
