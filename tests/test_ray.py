"""The Ray engine, on a local Ray instance inside a network namespace with only loopback.

Ray probes the network when it starts (public DNS servers to find its own address, cloud
metadata), even with usage statistics off; so Ray runs here under `unshare -n` (as root),
with HOME, TMPDIR and Ray's temporary directory in the test's own directory, and
RAY_AUTH_MODE=disabled (else Ray writes an auth token into the home directory).

Ray must be installed (`pip install -e '.[test,ray]'`): without it this test fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE
from helpers import read_rows

import packtool
from packtool.engines import pack_units
from packtool.merge import merge_units

# Slow, and one Ray instance at a time: the tests share one xdist worker (--dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


def in_network_namespace(args: list[str], env: dict[str, str], timeout: float) -> str:
    """Run ``args`` in a new network namespace (loopback only); return stdout."""
    assert os.geteuid() == 0, "the Ray test runs Ray in a network namespace: run it as root"
    assert shutil.which("unshare") and shutil.which("ip"), "needs unshare and ip (util-linux)"
    script = 'ip link set lo up && exec "$@"'
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", script, "sh", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def short_tmp():
    """The test's own directory, short: Ray's socket paths must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ptray-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_ray_engine_gives_the_rows_of_the_local_engine(short_tmp: Path) -> None:
    assert importlib.util.find_spec("ray") is not None, (
        "Ray is not installed: pip install -e '.[test,ray]' (this test fails, never skips)"
    )

    home, tmp = short_tmp / "home", short_tmp / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAY_") and k not in ("HOME", "TMPDIR")
    }
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        RAY_AUTH_MODE="disabled",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
    )
    out = short_tmp / "ray-out"
    stdout = in_network_namespace(
        [
            sys.executable,
            "-m",
            "packtool.cli",
            "pack",
            str(SAMPLE),
            "--max-len",
            "4096",
            "-o",
            str(out),
            "--units",
            "4",
            "--engine",
            "ray",
            "--json",
        ],
        env,
        timeout=600,
    )
    summary = json.loads(stdout)

    # It really ran on Ray: every unit in a Ray worker process, not in the driver.
    assert summary["engine"] == "ray"
    units = summary["units_run"]
    assert [u["index"] for u in units] == [0, 1, 2, 3]
    assert not any(u["skipped"] for u in units)
    driver = summary["driver"]["pid"]
    workers = {u["pid"] for u in units}
    assert driver not in workers
    # The tokenizer is loaded once per worker process, whatever number of units it ran.
    loads = Counter(u["pid"] for u in units if u["tokenizer_loaded"])
    assert loads == Counter(workers)
    # Ray left nothing behind: its temporary directory is gone, no token in HOME.
    assert list(tmp.iterdir()) == []
    assert list(home.iterdir()) == []

    # The same rows (all columns) as the local engine and as --unit runs plus a merge.
    _, ray_rows = read_rows(out)
    pack_units([SAMPLE], short_tmp / "local", units=4, max_len=4096)
    _, local_rows = read_rows(short_tmp / "local")
    assert ray_rows == local_rows
    for i in range(4):
        pack_units([SAMPLE], short_tmp / "array", units=4, unit=i, max_len=4096)
    merge_units(short_tmp / "array")
    _, array_rows = read_rows(short_tmp / "array")
    assert array_rows == local_rows
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["global_ffd_rows"] <= manifest["rows"] == len(ray_rows)
    # The driver's merge is the local engine's: it lists the units' shards, copying no row.
    assert manifest["units"]["copied"] is False
    assert all(s["file"].startswith("units/unit-") for s in manifest["shards"])
    assert not list(out.glob("*.arrow"))


def test_ray_usage_statistics_are_off(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(short_tmp), TMPDIR=str(short_tmp), PYTHONPATH=str(REPO))
    code = (
        "import os; from packtool.engines.ray import import_ray; import_ray(); "
        "print(os.environ['RAY_USAGE_STATS_ENABLED'])"
    )
    assert in_network_namespace([sys.executable, "-c", code], env, timeout=120).strip() == "0"


def test_a_two_node_ray_cluster_gives_the_rows_of_the_local_engine(short_tmp: Path) -> None:
    """One cluster of two nodes for text, chat and pre-tokenized cases."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 900, int(rng.integers(1, 300))).tolist() for _ in range(2000)]
    labels = [[t if t % 3 else -100 for t in d] for d in docs]
    ids = short_tmp / "ids.parquet"
    pq.write_table(pa.table({"ids": docs, "y": labels}), ids, row_group_size=100)
    chat = REPO / "sample_data" / "chat.jsonl"
    template = str(REPO / "sample_data" / "chatml.jinja")
    cases = {
        "text": ([SAMPLE], {"units": 4, "max_len": 4096}),
        "chat": ([chat], {"units": 3, "max_len": 2048, "chat_template": template}),
        "ids": (
            [ids],
            {"units": 4, "max_len": 1024, "ids_field": "ids", "labels_field": "y", "pad_id": 0},
        ),
    }
    result = on_two_nodes(short_tmp, cases)
    assert result["nodes"] == 2
    for name, (inputs, kw) in cases.items():
        units = result["cases"][name]["units"]
        assert [u["index"] for u in units] == list(range(kw["units"]))
        # The units ran in worker processes of both nodes (each node's raylet starts its own).
        assert len({u["raylet"] for u in units}) == 2, (name, units)
        pack_units(inputs, short_tmp / f"local-{name}", num_proc=2, **kw)
        _, local_rows = read_rows(short_tmp / f"local-{name}")
        _, ray_rows = read_rows(short_tmp / name)
        assert ray_rows == local_rows, name  # every column, row for row
        assert result["cases"][name]["rows"] == len(local_rows)


def on_two_nodes(short_tmp: Path, cases: dict) -> dict:
    """Run ``pack_units(inputs, short_tmp / NAME, engine="ray", **options)`` for each case
    (``{NAME: (inputs, options)}``) on a fresh Ray cluster of two nodes, in a network
    namespace (tests/ray_two_nodes.py); its report."""
    spec = {
        name: {"inputs": [str(p) for p in inputs], "out": str(short_tmp / name), "options": kw}
        for name, (inputs, kw) in cases.items()
    }
    home, tmp = short_tmp / "home", short_tmp / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAY_") and k not in ("HOME", "TMPDIR")
    }
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
    )
    script = str(REPO / "tests" / "ray_two_nodes.py")
    stdout = in_network_namespace([sys.executable, script, json.dumps(spec)], env, timeout=900)
    return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_mixture_on_two_ray_nodes_is_the_mixture_of_one_pack(short_tmp: Path) -> None:
    """pack --mix --units on a two-node cluster: the units are measured (tokenized) on both
    nodes, the mixture planned once in the driver, the units packed from the tokens kept;
    the rows are the local engine's, the mixture that of one pack."""
    lines = SAMPLE.read_text("utf-8").splitlines(keepends=True)
    mix = [short_tmp / "web.jsonl", short_tmp / "code.jsonl", short_tmp / "math.jsonl"]
    for path, (a, b) in zip(mix, [(0, 1400), (1400, 2000), (2000, 2200)], strict=True):
        path.write_text("".join(lines[a:b]), "utf-8")
    options = {"max_len": 1024, "mix": "1,1,1", "tokens": "1M"}
    result = on_two_nodes(short_tmp, {"mix": (mix, {"units": 4, **options})})
    assert result["nodes"] == 2
    case = result["cases"]["mix"]
    assert [u["index"] for u in case["units"]] == [u["index"] for u in case["measured"]] == [
        0, 1, 2, 3,
    ]  # fmt: skip
    assert len({u["raylet"] for u in case["measured"]}) == 2, case  # tokenized on both nodes
    pack_units(mix, short_tmp / "local", units=4, num_proc=2, **options)
    packtool.pack(mix, short_tmp / "one", **options)
    merged, ray_rows = read_rows(short_tmp / "mix")
    assert ray_rows == read_rows(short_tmp / "local")[1]  # every column, row for row
    one = read_rows(short_tmp / "one")[0]
    assert merged["mixture"] == one["mixture"] and merged["mixture"]["copies"] > 1
    assert "source_ids" in merged["columns"] and case["rows"] == len(ray_rows)
    assert not list((short_tmp / "mix" / "units").glob(".*packtool-work"))  # tokens kept: gone
