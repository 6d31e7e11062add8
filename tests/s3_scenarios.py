"""Scenarios against a real S3 server (moto_server on loopback), run by tests/test_s3.py inside
a network namespace that has only loopback: `python tests/s3_scenarios.py NAME WORKDIR`.

Each scenario starts its own moto_server, points AWS_ENDPOINT_URL at it with dummy keys, and
fails with an AssertionError (a non-zero exit) when packtool does not do what it should. The
shard bytes are compared with a local run's, read plainly with pyarrow (tests/helpers.py).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data" / "corpus.jsonl"
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def start_moto(workdir: Path) -> subprocess.Popen:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(workdir / "moto.log", "wb")  # noqa: SIM115 - the server's whole life
    server = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise AssertionError("moto_server did not start")
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing-secret-not-logged",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return server


def s3():
    import boto3

    return boto3.client("s3")


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "packtool.cli", *args], capture_output=True, text=True
    )
    if check:
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr}"
    return proc


def shard_bytes(url_or_dir: str) -> list[bytes]:
    """The shards' bytes, in manifest order, read without packtool."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url_or_dir)
    manifest = json.loads(fs.cat_file(f"{root}/manifest.json"))
    return [fs.cat_file(f"{root}/{s['file']}") for s in manifest["shards"]]


def local_pack(workdir: Path, name: str, *args: str) -> str:
    out = workdir / name
    cli("pack", *args, "-L", "4096", "-o", str(out), "-q", "--overwrite")
    return str(out)


def inputs(workdir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = s3()
    client.create_bucket(Bucket="data")
    client.create_bucket(Bucket="out")
    data = SAMPLE.read_bytes()
    client.put_object(Bucket="data", Key="corpus.jsonl", Body=data)
    lines = data.splitlines(keepends=True)
    half = len(lines) // 2
    for i, part in enumerate((lines[:half], lines[half:])):
        client.put_object(
            Bucket="data", Key=f"gz/part-{i}.jsonl.gz", Body=gzip.compress(b"".join(part))
        )
        (workdir / "gz").mkdir(exist_ok=True)
        (workdir / "gz" / f"part-{i}.jsonl.gz").write_bytes(gzip.compress(b"".join(part)))
    texts = [json.loads(line)["text"] for line in lines]
    pq.write_table(pa.table({"text": texts}), workdir / "corpus.parquet", row_group_size=500)
    client.upload_file(str(workdir / "corpus.parquet"), "data", "corpus.parquet")
    tok = REPO / "packtool" / "_data" / "tokenizer.json"
    client.upload_file(str(tok), "data", "tok/tokenizer.json")


def scenario_pack(workdir: Path) -> None:
    """S3 -> S3 equals local for JSONL, a .jsonl.gz prefix and Parquet; tokenizer on S3; every
    reader on S3; nothing secret in the manifest."""
    inputs(workdir)
    cases = [
        ("s3://data/corpus.jsonl", str(SAMPLE)),
        ("s3://data/gz/", str(workdir / "gz")),
        ("s3://data/corpus.parquet", str(workdir / "corpus.parquet")),
    ]
    for i, (url, local) in enumerate(cases):
        out = f"s3://out/case{i}"
        cli("pack", url, "-L", "4096", "-o", out, "-q")
        assert shard_bytes(out) == shard_bytes(local_pack(workdir, f"local{i}", local)), url
        manifest = s3().get_object(Bucket="out", Key=f"case{i}/manifest.json")["Body"].read()
        assert b"testing-secret" not in manifest and b"127.0.0.1" not in manifest
        assert url.rstrip("/").encode() in manifest  # the URL is recorded
    # tokenizer on the store (a file and its prefix): the same rows as the bundled one
    for tok in ("s3://data/tok/tokenizer.json", "s3://data/tok/"):
        cli("pack", "s3://data/corpus.jsonl", "-L", "4096", "-o", "s3://out/tok", "-q",
            "--tokenizer", tok, "--overwrite")  # fmt: skip
        assert shard_bytes("s3://out/tok") == shard_bytes(str(workdir / "local0"))
    # readers: verify (also --against the inputs on S3), stats, inspect, open_packed, torch
    assert "problems" in cli("verify", "s3://out/case0").stdout
    cli("verify", "s3://out/case0", "--against", "s3://data/corpus.jsonl")
    local_stats = json.loads(cli("stats", str(workdir / "local0"), "--json").stdout)
    store_stats = json.loads(cli("stats", "s3://out/case0", "--json").stdout)
    for key in ("rows", "tokens", "efficiency"):
        assert store_stats[key] == local_stats[key], key
    assert "cu_seqlens" in cli("inspect", "s3://out/case0", "--row", "3").stdout

    import numpy as np

    import packtool
    from packtool.torch import PackedDataset

    store, local = packtool.open_packed("s3://out/case0"), packtool.open_packed(workdir / "local0")
    assert len(store) == len(local)
    for i in (0, len(store) // 2, len(store) - 1):
        assert np.array_equal(store[i].input_ids, local[i].input_ids)
    ds_store, ds_local = PackedDataset("s3://out/case0"), PackedDataset(workdir / "local0")
    cached = PackedDataset("s3://out/case0", cache_dir=workdir / "shard-cache")
    assert len(ds_store) == len(ds_local) == len(cached)
    for i in (0, 5, len(ds_local) - 1):
        for ds in (ds_store, cached):
            assert all(
                np.array_equal(np.asarray(ds[i][k]), np.asarray(ds_local[i][k]))
                for k in ds_local[i]
            )
    assert len(list((workdir / "shard-cache").glob("*.arrow"))) >= 1
    # a prefix without a manifest is refused by every reader, in one line
    s3().put_object(Bucket="out", Key="half/data-00000-of-00002.arrow", Body=b"partial")
    for command in (["verify"], ["stats"], ["inspect", "--row", "0"]):
        proc = cli(*command[:1], "s3://out/half", *command[1:], check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "manifest" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # a rerun over the half-written prefix works; a finished output needs --overwrite
    cli("pack", "s3://data/corpus.jsonl", "-L", "4096", "-o", "s3://out/half", "-q")
    assert shard_bytes("s3://out/half") == shard_bytes(str(workdir / "local0"))
    names = {o["Key"] for o in s3().list_objects_v2(Bucket="out", Prefix="half/")["Contents"]}
    assert "half/data-00000-of-00002.arrow" not in names  # the stale shard is gone
    proc = cli("pack", "s3://data/corpus.jsonl", "-L", "4096", "-o", "s3://out/half", check=False)
    assert proc.returncode != 0 and "--overwrite" in proc.stderr


def scenario_faults(workdir: Path) -> None:
    """A run killed midway leaves no manifest, and a rerun gives the local bytes; a missing
    bucket, a denied write and missing credentials are one line each, before any work."""
    inputs(workdir)
    big = SAMPLE.read_bytes() * 12  # long enough to be killed while it works
    s3().put_object(Bucket="data", Key="big.jsonl", Body=big)
    (workdir / "big.jsonl").write_bytes(big)
    args = ["pack", "s3://data/big.jsonl", "-L", "4096", "-o", "s3://out/killed", "-q",
            "--rows-per-shard", "64", "--tokenizer-backend", "hf"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "packtool.cli", *args])
    deadline = time.monotonic() + 120
    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    while not any(p.name.startswith("packtool-store-") for p in scratch.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
        time.sleep(0.05)
    time.sleep(1.0)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    listed = s3().list_objects_v2(Bucket="out", Prefix="killed/").get("Contents", [])
    assert not any(o["Key"].endswith("manifest.json") for o in listed)
    refused = cli("verify", "s3://out/killed", check=False)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
    cli(*args)
    local = local_pack(workdir, "big-local", str(workdir / "big.jsonl"), "--rows-per-shard", "64",
                       "--tokenizer-backend", "hf")  # fmt: skip
    assert shard_bytes("s3://out/killed") == shard_bytes(local)
    # Ctrl-C: the message says the prefix is not complete (a store keeps what was uploaded)
    stop = [*args[:5], "s3://out/interrupted", *args[6:]]
    proc = subprocess.Popen([sys.executable, "-m", "packtool.cli", *stop], stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    time.sleep(0.5)
    while not any(p.name.startswith("packtool-store-") for p in scratch.iterdir()):
        assert time.monotonic() < deadline + 120 and proc.poll() is None, "it never started"
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "s3://out/interrupted is not complete (no manifest" in stderr, stderr

    def one_line_error(*args: str, expect: str) -> None:
        proc = cli(*args, check=False)
        assert proc.returncode != 0, proc.stdout
        assert "Traceback" not in proc.stderr and expect in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "testing-secret" not in proc.stderr

    one_line_error("pack", str(SAMPLE), "-L", "4096", "-o", "s3://no-such-bucket/x",
                   expect="no such bucket")  # fmt: skip
    s3().create_bucket(Bucket="locked")
    deny = {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": "*",
            "Action": "s3:PutObject", "Resource": "arn:aws:s3:::locked/*"}]}  # fmt: skip
    s3().put_bucket_policy(Bucket="locked", Policy=json.dumps(deny))
    started = time.monotonic()
    one_line_error("pack", str(SAMPLE), "-L", "4096", "-o", "s3://locked/x",
                   expect="access denied")  # fmt: skip
    assert time.monotonic() - started < 30
    one_line_error("pack", "s3://data/missing.jsonl", "-L", "4096", "-o", str(workdir / "o"),
                   expect="no such file")  # fmt: skip
    one_line_error("pack", str(SAMPLE), "-L", "4096", "-o", "nosuchproto://b/x",
                   expect="not a protocol fsspec knows")  # fmt: skip
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.pop(key)
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.environ["AWS_CONFIG_FILE"] = "/nonexistent"
    one_line_error("pack", str(SAMPLE), "-L", "4096", "-o", "s3://out/nokeys",
                   expect="no credentials")  # fmt: skip


def scenario_ray(workdir: Path) -> None:
    """Two Ray nodes (a head and a second node) packing S3 -> S3 in units: the local engine's
    rows, all columns; a rerun skips the finished units."""
    import ray
    from helpers import read_rows
    from ray.cluster_utils import Cluster

    from packtool.engines import pack_units

    inputs(workdir)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        ray.shutdown()
        report = pack_units(["s3://data/corpus.jsonl"], "s3://out/ray", units=4, max_len=4096,
                            engine="ray", ray_address=cluster.address)  # fmt: skip
        assert report.packed == 4
        again = pack_units(["s3://data/corpus.jsonl"], "s3://out/ray", units=4, max_len=4096,
                           engine="ray", ray_address=cluster.address)  # fmt: skip
        assert again.merged is not None and again.packed == 0
    finally:
        ray.shutdown()
        cluster.shutdown()
    pack_units([SAMPLE], workdir / "local", units=4, max_len=4096)
    _, local_rows = read_rows(workdir / "local")
    import fsspec

    fsspec.filesystem("s3").get("out/ray", str(workdir / "ray"), recursive=True)
    _, ray_rows = read_rows(workdir / "ray")
    assert ray_rows == local_rows
    units = s3().list_objects_v2(Bucket="out", Prefix="ray/units/")["Contents"]
    assert sum(o["Key"].endswith("manifest.json") for o in units) == 4
    # The merge wrote no token byte to the store: its manifest lists the units' shards.
    top = s3().list_objects_v2(Bucket="out", Prefix="ray/", Delimiter="/")["Contents"]
    assert not [o["Key"] for o in top if o["Key"].endswith(".arrow")], top
    merged = json.loads((workdir / "ray" / "manifest.json").read_text())
    assert merged["units"]["copied"] is False
    assert all(s["file"].startswith("units/") for s in merged["shards"])


def scenario_mix(workdir: Path) -> None:
    """pack --mix of sources on S3 into S3, in one run with --world-size and in units: the
    rows hold each segment's source id, the local run's documents and sources (and, in one
    run, its shard bytes); the mixture record is the local one's but for the paths."""
    from helpers import documents_with_sources, read_rows

    from packtool.engines import pack_units

    client = s3()
    client.create_bucket(Bucket="data")
    client.create_bucket(Bucket="out")
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    parts = {"web.jsonl": lines[:600], "code.jsonl": lines[600:800],
             "math/a.jsonl": lines[800:830], "math/b.jsonl": lines[830:860]}  # fmt: skip
    for name, part in parts.items():
        client.put_object(Bucket="data", Key=f"mix/{name}", Body=b"".join(part))
        (workdir / "mix" / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / "mix" / name).write_bytes(b"".join(part))
    names = ("web.jsonl", "code.jsonl", "math/")
    urls = [f"s3://data/mix/{n}" for n in names]
    local = [str(workdir / "mix" / n) for n in names]
    args = ("--mix", "1,1,1", "--tokens", "300k", "-L", "256", "--world-size", "2", "-q")
    cli("pack", *urls, *args, "-o", "s3://out/mix")
    cli("pack", *local, *args, "-o", str(workdir / "local-mix"))
    assert shard_bytes("s3://out/mix") == shard_bytes(str(workdir / "local-mix"))
    cli("verify", "s3://out/mix")

    import fsspec

    def mixture(manifest: dict) -> dict:
        return {**manifest["mixture"], "sources": [
            {k: v for k, v in src.items() if k != "path"} for src in manifest["mixture"]["sources"]
        ]}  # fmt: skip

    fsspec.filesystem("s3").get("out/mix", str(workdir / "got-mix"), recursive=True)
    manifest, rows = read_rows(workdir / "got-mix")
    local_manifest, local_rows = read_rows(workdir / "local-mix")
    assert manifest["balance"]["world_size"] == 2 and "source_ids" in manifest["columns"]
    paths = [s["path"] for s in manifest["mixture"]["sources"]]
    assert paths == [u.rstrip("/") for u in urls], paths  # as the command line gives them
    assert mixture(manifest) == mixture(local_manifest)
    assert documents_with_sources(rows) == documents_with_sources(local_rows)
    # units, S3 -> S3: the measured tokens kept in the scratch directory, then packed
    report = pack_units(urls, "s3://out/mixu", units=3, max_len=256, mix="1,1,1", tokens="300k")
    assert report.packed == 3 and len(report.measured) == 3
    cli("verify", "s3://out/mixu")
    fsspec.filesystem("s3").get("out/mixu", str(workdir / "got-mixu"), recursive=True)
    manifest, rows = read_rows(workdir / "got-mixu")
    assert mixture(manifest) == mixture(local_manifest)
    assert documents_with_sources(rows) == documents_with_sources(local_rows)
    again = pack_units(urls, "s3://out/mixu", units=3, max_len=256, mix="1,1,1", tokens="300k")
    assert again.merged is not None and again.packed == 0


def one_line_error(*args: str, expect: str) -> str:
    proc = cli(*args, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr and expect in proc.stderr, proc.stderr
    assert "Task exception was never retrieved" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def scenario_outage(workdir: Path) -> None:
    """Unfinished multipart uploads a killed run left under the output are aborted by the next
    run; a store that stops answering (SIGSTOP) or is gone (killed) fails a pack in one line
    after a bounded time."""
    client = s3()
    client.create_bucket(Bucket="out")
    key = "mp/data-00000-of-00001.arrow"
    upload = client.create_multipart_upload(Bucket="out", Key=key)["UploadId"]
    client.upload_part(Bucket="out", Key=key, UploadId=upload, PartNumber=1, Body=bytes(5 << 20))
    client.create_multipart_upload(Bucket="out", Key="mpx/other")  # another prefix: kept
    cli("pack", str(SAMPLE), "-L", "4096", "-o", "s3://out/mp", "-q")
    left = client.list_multipart_uploads(Bucket="out").get("Uploads", [])
    assert [u["Key"] for u in left] == ["mpx/other"], left

    assert SERVER is not None
    os.environ["PACKTOOL_STORE_TIMEOUT"] = "2"
    SERVER.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does), never answers
    started = time.monotonic()
    one_line_error("pack", str(SAMPLE), "-L", "4096", "-o", "s3://out/paused",
                   expect="did not answer within 2 s")  # fmt: skip
    assert time.monotonic() - started < 45, time.monotonic() - started
    SERVER.send_signal(signal.SIGCONT)
    del os.environ["PACKTOOL_STORE_TIMEOUT"]

    SERVER.kill()
    SERVER.wait()
    started = time.monotonic()
    one_line_error("pack", str(SAMPLE), "-L", "4096", "-o", "s3://out/gone",
                   expect="cannot reach the store")  # fmt: skip
    assert time.monotonic() - started < 10, time.monotonic() - started


SERVER: subprocess.Popen | None = None

if __name__ == "__main__":
    name, workdir = sys.argv[1], Path(sys.argv[2])
    SERVER = start_moto(workdir)
    try:
        globals()[f"scenario_{name}"](workdir)
    finally:
        SERVER.send_signal(signal.SIGCONT)
        SERVER.terminate()
        SERVER.wait()
    print(f"scenario {name}: ok")
