"""Helpers for the Ray engine's cluster tests (tests/pipeline/test_ray_cluster.py).

- ``held``: the colour-square model (``-m tests/ray_cluster.py:held``) whose forward passes in a Ray actor wait
  for the file ``open`` in the folder ``GRADCAM_TEST_GATE``, each first leaving ``held-<node id>-<pid>`` there: a
  test knows that an actor is busy, and on which node, before it acts. An actor on a node for which the gate holds
  a file ``after-<node id>`` containing N runs its first N passes freely.
- :func:`listening`: the TCP and UDP sockets that the processes of one session listen on (from ``/proc``).
- Run as a script (``python ray_cluster.py ROOT HEAD_CPUS WORKER_CPUS``): a two-node Ray cluster on this machine,
  Ray's ``ray.cluster_utils.Cluster`` (a head and a second node, each its own raylet, object store and temp folder
  under ROOT), every node on the loopback. An actor of its own holds every CPU of the head, so that the work of a
  run starts on the second node; it writes ``ROOT/cluster.json`` (the address, the second node's id and its
  raylet's pid), frees the head's CPUs on a line ``free`` on its standard input, and stops the cluster when that
  input closes.

``ray start`` cannot make the second node on the loopback: Ray replaces ``--node-ip-address 127.0.0.1`` (and an
``--address`` on 127.0.0.1) by the machine's network address, and refuses a second node where
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it on the loopback. The cluster utilities take the node address as
given. The script's environment is given by the test: that switch at 0, so that the processes that Ray starts see
the loopback as their address too, ``RAY_TMPDIR`` (Ray's address file) and the token of ``RAY_AUTH_MODE=token``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from square_model import ColourDetector

LOOPBACK = "127.0.0.1"
HANG_GUARD = 600
"""Seconds a held forward pass waits before it fails: a guard against hangs only."""


def _actor_node() -> str | None:
    """The id of this process's node when it is a Ray actor, else ``None`` (the driver, a local run)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return None
    return str(ray.get_runtime_context().get_node_id())


class Held(ColourDetector):
    """:class:`ColourDetector` whose forward passes in an actor wait at the gate (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, node = os.environ.get("GRADCAM_TEST_GATE"), _actor_node()
        if gate and node is not None:
            self.calls += 1
            after = Path(gate, f"after-{node}")
            if self.calls > (int(after.read_text()) if after.exists() else 0):
                Path(gate, f"held-{node}-{os.getpid()}").touch()
                waited = 0.0
                while not Path(gate, "open").exists():
                    if waited > HANG_GUARD:
                        raise RuntimeError("the test never opened the gate")
                    time.sleep(0.05)
                    waited += 0.05
        return super().forward(x)


def held() -> Held:
    """Factory for ``--model tests/ray_cluster.py:held``."""
    return Held()


def listening(session: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket listening, and every UDP socket bound, in processes of
    ``session`` (Linux's ``/proc``)."""
    import ipaddress

    inodes: dict[str, tuple[str, int]] = {}
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path("/proc/net", table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != ("0A" if table.startswith("tcp") else "07") or inode == "0":
                continue  # TCP: LISTEN only; UDP: unconnected (07), which receives from anyone
            host, port = local.split(":")
            raw = bytes.fromhex(host)
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word host order
            address = ipaddress.ip_address(words)
            address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1
            inodes[inode] = (str(address), int(port, 16))
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path("/proc", pid, "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[3]) != session:
                continue
            name = stat.split("(", 1)[1].rsplit(")", 1)[0]
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    found.append((*inodes[target[8:-1]], name))
        except OSError:  # the process ended meanwhile
            continue
    return found


class Holder:
    """An actor that holds CPUs while it lives."""

    def ready(self) -> bool:
        return True


def main(root: Path, head_cpus: int, worker_cpus: int) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    common = {"node_ip_address": LOOPBACK, "num_gpus": 0, "object_store_memory": 100 * 1024 * 1024}
    head = {**common, "num_cpus": head_cpus, "include_dashboard": False, "temp_dir": str(root / "head")}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        worker = cluster.add_node(**common, num_cpus=worker_cpus, temp_dir=str(root / "worker"))
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        on_head = NodeAffinitySchedulingStrategy(cluster.head_node.node_id, soft=False)
        holder = ray.remote(Holder).options(num_cpus=head_cpus, scheduling_strategy=on_head).remote()
        ray.get(holder.ready.remote(), timeout=HANG_GUARD)
        raylet = worker.all_processes["raylet"][0].process.pid
        told = {"address": cluster.address, "node": worker.node_id, "raylet": raylet}
        (root / "cluster.part").write_text(json.dumps(told))
        (root / "cluster.part").rename(root / "cluster.json")
        for line in sys.stdin:
            if line.strip() == "free":
                ray.kill(holder)
        ray.shutdown()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
