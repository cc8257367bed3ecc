"""Compute nodes as Linux namespaces on one machine, joined to the host by a bridge.

:class:`NodeNetwork` is what :class:`tests.slurm.cluster.Cluster` uses for ``nodes > 1``:
it claims a bridge ``audbr<X>`` holding ``10.231.<X>.1/24`` (the controller's address;
``X`` is the first number whose bridge name and range are free, so two clusters can run
at once), and for each node starts ``unshare --net --uts --mount --pid --fork --kill-child
--mount-proc`` around :data:`INIT` (a bash pid 1 that names the node, waits for the go
file, runs the node's command, forwards SIGTERM to it and reaps the orphans that pid 1
inherits: slurmstepd is double-forked), then links a veth pair ``aud<X>n<i>`` (host end,
on the bridge) to ``eth0`` in the node holding ``10.231.<X>.<10+i>``.

Facts this encodes: ``ip netns exec`` is not used (it remounts /sys, and Slurm 22.05's
slurmd then loses the cgroup mount it reads); the network is entered with ``nsenter
--net=/proc/<init>/ns/net``. ``unshare --mount`` makes every mount private, so the fresh
/proc (which proctrack/linuxproc and jobacct_gather read, and which must show the node's
own pid namespace) does not leak to the host, while every other path (the temporary
directory, /work, /tmp) stays shared. Inside a node /proc shows that namespace only:
``NSpid`` in /proc/self/status has one entry there, and pid 1 is the node's init, so
two nodes' processes can have the same pid (pid 1, at least). ``unshare --fork`` ignores
SIGTERM, so the init (its only child) is signalled; when the init exits the kernel kills
everything left in that pid namespace, and the veth pair goes with the network
namespace. Pathname Unix sockets (munged's) are reachable across network namespaces.

Any failure to make the namespaces or links raises :class:`NamespaceUnavailable` with
the tool's one-line error (the cluster turns it into ``Unavailable``: the tests skip).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["INIT", "PROGRAMS", "NamespaceUnavailable", "Node", "NodeNetwork",
           "unavailable_reason"]

PROGRAMS: tuple[str, ...] = ("ip", "unshare", "nsenter")
"""What making the nodes needs (iproute2 and util-linux)."""

RANGE = "10.231"
"""The private range: node ``i`` of bridge ``X`` is ``10.231.X.(10 + i)``."""

INIT = r"""#!/bin/bash
# pid 1 of one node: name it, wait for the go file, run the node's command, reap orphans.
name=$1; go=$2; shift 2
echo "$name" > /proc/sys/kernel/hostname || exit 97
while [ ! -e "$go" ]; do sleep 0.05; done
"$@" & child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
"""
"""The namespace's init (``bash node-init.sh NAME GO COMMAND...``). A bash waiting in
``wait`` reaps every child that exits, the reparented ones included (no zombies)."""

TOOL_TIMEOUT_S = 30


class NamespaceUnavailable(Exception):
    """Namespaces or links cannot be made here (not root, a tool missing, refused)."""


def unavailable_reason() -> str | None:
    """Why nodes cannot be made here (one line), or None when they can be tried."""
    if os.geteuid() != 0:
        return "multi-node Slurm tests need root (network, pid and mount namespaces)"
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [name for name in PROGRAMS if shutil.which(name, path=paths) is None]
    if missing:
        return f"multi-node Slurm tests need {', '.join(missing)} (iproute2, util-linux)"
    return None


def _tool(command: Sequence[str], *, stdin: str | None = None,
          ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(command), input=stdin, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NamespaceUnavailable(f"{command[0]}: {error}") from None


def _must(command: Sequence[str], *, stdin: str | None = None) -> None:
    result = _tool(command, stdin=stdin)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["(no output)"]
        raise NamespaceUnavailable(f"{' '.join(command[:4])} failed: {lines[-1][:300]}")


def _used_networks() -> list[ipaddress.IPv4Network]:
    result = _tool(["ip", "-o", "-4", "addr", "show"])
    found = []
    for line in result.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            found.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    return found


def _init_pid(unshare: int) -> int | None:
    """The host pid of ``unshare --fork``'s only child (the node's init), once it exists."""
    try:
        children = Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


@dataclass
class Node:
    """One node: its name, address, the ``unshare`` process and its init's host pid."""

    name: str
    address: str
    veth: str
    go: Path
    process: subprocess.Popen[bytes]
    init: int = 0

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the node's init, if it is still the unshare's child."""
        if self.process.poll() is None and self.init and _init_pid(self.process.pid) == self.init:
            try:
                os.kill(self.init, signum)
            except ProcessLookupError:
                pass

    def enter(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside every namespace of this node (pid, mount, UTS, net)."""
        return ["nsenter", f"--target={self.init}", "--pid", "--mount", "--uts", "--net",
                "--", *command]


@dataclass
class NodeNetwork:
    """A bridge and its nodes; :meth:`close` removes what it made."""

    bridge: str
    octet: int
    nodes: list[Node] = field(default_factory=list)

    @property
    def controller(self) -> str:
        """The host's address on the bridge (where slurmctld and slurmdbd are reached)."""
        return f"{RANGE}.{self.octet}.1"

    def address(self, index: int) -> str:
        """Node ``index``'s address (1-based)."""
        return f"{RANGE}.{self.octet}.{10 + index}"

    @classmethod
    def claim(cls) -> NodeNetwork:
        """Make a bridge on the first free ``10.231.X.0/24``; :class:`NamespaceUnavailable`
        when none can be made."""
        reason = unavailable_reason()
        if reason is not None:
            raise NamespaceUnavailable(reason)
        used = _used_networks()
        for octet in range(256):
            network = ipaddress.IPv4Network(f"{RANGE}.{octet}.0/24")
            if any(network.overlaps(other) for other in used):
                continue
            bridge = f"audbr{octet}"
            made = _tool(["ip", "link", "add", "name", bridge, "type", "bridge",
                          "forward_delay", "0", "stp_state", "0"])
            if made.returncode != 0 and "exists" in made.stderr:
                continue  # another cluster's (or a leftover): try the next range
            if made.returncode != 0:
                raise NamespaceUnavailable(f"ip link add {bridge} type bridge failed: "
                                           f"{made.stderr.strip()[:300]}")
            net = cls(bridge=bridge, octet=octet)
            try:
                _must(["ip", "addr", "add", f"{net.controller}/24", "dev", bridge])
                _must(["ip", "link", "set", bridge, "up"])
            except BaseException:
                net.close()
                raise
            return net
        raise NamespaceUnavailable(f"no free {RANGE}.X.0/24 range for a bridge")

    def add_node(self, name: str, command: Sequence[str], *, go: Path, stdout: Path,
                 env: dict[str, str]) -> Node:
        """Start node ``name``'s namespaces (its init, ``node-init.sh`` beside ``go``, waits
        for that file) and link them to the bridge; ``command`` runs once :meth:`go` is
        called."""
        index = len(self.nodes) + 1
        init = go.parent / "node-init.sh"
        if not init.exists():
            init.write_text(INIT)
        with open(stdout, "wb") as out:
            try:
                process = subprocess.Popen(
                    ["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--kill-child",
                     "--mount-proc", "--", "bash", str(init), name, str(go), *command],
                    env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
            except OSError as error:
                raise NamespaceUnavailable(f"unshare: {error}") from None
        node = Node(name=name, address=self.address(index), veth=f"aud{self.octet}n{index}",
                    go=go, process=process)
        self.nodes.append(node)
        deadline = time.monotonic() + TOOL_TIMEOUT_S
        while not node.init:
            if process.poll() is not None:
                text = stdout.read_text(errors="replace").strip().splitlines() or ["(no output)"]
                raise NamespaceUnavailable(f"unshare exited {process.returncode}: "
                                           f"{text[-1][:300]}")
            if time.monotonic() > deadline:
                raise NamespaceUnavailable(f"unshare made no init for {name}")
            node.init = _init_pid(process.pid) or 0
            if not node.init:
                time.sleep(0.02)
        _must(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0",
               "netns", str(node.init)])
        _must(["ip", "link", "set", node.veth, "master", self.bridge, "up"])
        _must(["nsenter", f"--net=/proc/{node.init}/ns/net", "ip", "-batch", "-"],
              stdin=f"link set lo up\naddr add {node.address}/24 dev eth0\n"
                    "link set eth0 up\n")
        return node

    def go(self) -> None:
        """Let every node's init run its command."""
        for node in self.nodes:
            node.go.touch()

    def close(self, *, wait_s: float = 20) -> None:
        """End every node (SIGTERM to its init, SIGKILL to the unshare after ``wait_s``,
        which takes the whole pid namespace with it), then remove the links and bridge."""
        for node in self.nodes:
            node.signal(signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        for node in self.nodes:
            try:
                node.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                node.process.kill()  # --kill-child: the init gets SIGKILL, and so the rest
                node.process.wait(timeout=10)
        with contextlib.suppress(NamespaceUnavailable):  # (ip gone: nothing more to do)
            for node in self.nodes:  # a veth goes with its namespace; this is for a stray
                if Path(f"/sys/class/net/{node.veth}").exists():
                    _tool(["ip", "link", "del", node.veth])
            _tool(["ip", "link", "del", self.bridge])
