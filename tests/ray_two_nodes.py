"""Run by test_ray.py inside a network namespace (loopback only): a Ray cluster of two nodes
(`ray.cluster_utils.Cluster`: a head and a second node, each its own raylet with one CPU),
and `pack_units(..., engine="ray")` on it for each case given. Prints one JSON object: the
nodes alive, and per case each unit's worker process and the raylet (node) that started it.

Usage: python ray_two_nodes.py CASES_JSON, where CASES_JSON maps a case name to
{"inputs": [...], "out": DIR, "options": {...}} (keyword arguments of pack_units).
"""

from __future__ import annotations

import json
import sys

import psutil
import ray
from ray.cluster_utils import Cluster

from packtool.engines import pack_units


def main() -> None:
    cases = json.loads(sys.argv[1])
    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        out = {"nodes": sum(1 for n in ray.nodes() if n["Alive"]), "cases": {}}
        for name, case in cases.items():
            report = pack_units(case["inputs"], case["out"], engine="ray", **case["options"])
            units = [
                {"index": u.index, "pid": u.pid, "raylet": psutil.Process(u.pid).ppid()}
                for u in report.units
            ]
            measured = [  # a mixture's units were measured first (another round of tasks)
                {"index": i, "pid": pid, "raylet": psutil.Process(pid).ppid()}
                for i, pid, _ in report.measured
            ]
            out["cases"][name] = {"units": units, "rows": report.merged.rows, "measured": measured}
        print(json.dumps(out))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
