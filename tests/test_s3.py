"""fsspec URLs in and out: the file-system seam (packtool/fs.py).

The fast cases use fsspec's in-process ``memory://`` store. The S3 cases run a real S3 server
(moto_server) on loopback inside a network namespace with nothing but loopback (`unshare -n`,
as tests/test_ray.py does), each scenario of tests/s3_scenarios.py as one subprocess: S3 -> S3
packs equal to local ones, the tokenizer on S3, every reader on S3, a SIGKILL midway and a
rerun, a missing bucket, a denied write, missing credentials, and two Ray nodes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, SAMPLE
from helpers import read_rows

import packtool
from packtool.errors import FormatError, InputError, OutputExistsError, StoreError
from packtool.format import open_packed
from packtool.fs import StorePath, as_path, is_url
from packtool.pipeline import pack

fsspec = pytest.importorskip("fsspec", reason="fsspec comes with datasets")


@pytest.fixture
def memory_prefix():
    """A fresh prefix on fsspec's in-process memory store, removed afterwards."""
    name = f"t{uuid.uuid4().hex[:10]}"
    fs = fsspec.filesystem("memory")
    yield fs, name
    if fs.exists(f"/{name}"):
        fs.rm(f"/{name}", recursive=True)


def test_urls_become_store_paths_and_local_paths_stay_paths() -> None:
    assert isinstance(as_path("s3://bucket/a/b.jsonl.gz"), StorePath)
    p = as_path("s3://bucket/a/b.jsonl.gz")
    assert (p.name, p.suffixes, str(p.parent)) == ("b.jsonl.gz", [".jsonl", ".gz"], "s3://bucket/a")
    assert str(p.parent / "c.parquet") == "s3://bucket/a/c.parquet"
    assert as_path("file:///tmp/x") == Path("/tmp/x")
    assert as_path("out/x") == Path("out/x") and not is_url("out/x") and not is_url(Path("a"))


def test_pack_memory_store_gives_the_local_bytes(memory_prefix, tmp_path: Path) -> None:
    fs, name = memory_prefix
    fs.pipe_file(f"/{name}/in/corpus.jsonl", SAMPLE.read_bytes())
    url = f"memory://{name}/out"
    report = pack([f"memory://{name}/in/"], url, max_len=4096)
    assert str(report.out_dir) == url
    local = pack([SAMPLE], tmp_path / "local", max_len=4096)
    assert [s["sha256"] for s in report.manifest["shards"]] == [
        s["sha256"] for s in local.manifest["shards"]
    ]
    _, local_rows = read_rows(tmp_path / "local")
    reader = packtool.open_packed(url)
    assert len(reader) == len(local_rows)
    assert reader[7].input_ids.tolist() == local_rows[7]["input_ids"]
    assert report.manifest["inputs"][0]["path"] == f"memory://{name}/in/corpus.jsonl"
    # a finished output is replaced only with overwrite
    with pytest.raises(OutputExistsError, match="--overwrite"):
        pack([SAMPLE], url, max_len=4096)
    with pytest.raises(OutputExistsError, match=r"is finished .*--resume continues only"):
        pack([SAMPLE], url, max_len=4096, resume=True)
    again = pack([SAMPLE], url, max_len=2048, overwrite=True)
    assert packtool.open_packed(url).max_len == 2048 == again.max_len
    assert not fs.exists(f"/{name}/out/data-00000-of-00001.arrow") or again.shards == 1


def test_a_prefix_without_a_manifest_is_refused_then_written_over(memory_prefix) -> None:
    fs, name = memory_prefix
    fs.pipe_file(f"/{name}/out/data-00000-of-00003.arrow", b"left by a killed run")
    with pytest.raises(FormatError, match=r"no manifest\.json"):
        packtool.open_packed(f"memory://{name}/out")
    pack([SAMPLE], f"memory://{name}/out", max_len=4096)  # a rerun writes over it
    assert not fs.exists(f"/{name}/out/data-00000-of-00003.arrow")
    assert len(packtool.open_packed(f"memory://{name}/out")) > 0
    fs.pipe_file(f"/{name}/other/notes.txt", b"not ours")
    with pytest.raises(OutputExistsError, match="not a packtool output"):
        pack([SAMPLE], f"memory://{name}/other", max_len=4096, overwrite=True)
    assert fs.cat_file(f"/{name}/other/notes.txt") == b"not ours"


def test_a_failed_run_publishes_nothing(memory_prefix) -> None:
    fs, name = memory_prefix
    fs.pipe_file(f"/{name}/bad.jsonl", b'{"text": "fine"}\n{"text": \n')
    with pytest.raises(packtool.errors.BadRecordError, match=r"bad\.jsonl:2"):
        pack([f"memory://{name}/bad.jsonl"], f"memory://{name}/out", max_len=64)
    assert not fs.exists(f"/{name}/out/manifest.json")


def test_unknown_protocols_and_missing_packages_are_one_line() -> None:
    with pytest.raises(StoreError, match="not a protocol fsspec knows"):
        as_path("nosuchproto://bucket/x").exists()
    # gcsfs is not installed here: the hint names the package
    if shutil.which("python") and not _installed("gcsfs"):
        with pytest.raises(StoreError, match="pip install 'gcsfs'"):
            as_path("gs://bucket/x").exists()


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- a real S3 server, in a network namespace ------------------------------------------------


def _namespace_problem() -> str | None:
    if os.geteuid() != 0:
        return "the S3 scenarios run moto_server in a network namespace: they need root"
    for tool in ("unshare", "ip", "moto_server"):
        if shutil.which(tool) is None:
            return f"the S3 scenarios need {tool} (util-linux, iproute2, moto[server])"
    if not _installed("s3fs"):
        return "s3fs is not installed: pip install -e '.[test]' (it brings packtool[s3])"
    return None


NAMESPACE = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def run_scenario(name: str, timeout: float) -> None:
    problem = _namespace_problem()
    if problem:
        pytest.skip(problem)
    work = Path(tempfile.mkdtemp(prefix=f"pts3-{name}-", dir="/tmp"))
    try:
        (work / "tmp").mkdir()
        (work / "home").mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWS_", "RAY_")) and k not in ("HOME", "TMPDIR")
        }
        env.update(
            HOME=str(work / "home"),
            TMPDIR=str(work / "tmp"),
            RAY_AUTH_MODE="disabled",
            PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
        )
        script = REPO / "tests" / "s3_scenarios.py"
        proc = subprocess.run(
            [
                "unshare",
                "-n",
                "sh",
                "-c",
                'ip link set lo up && exec "$@"',
                "sh",
                sys.executable,
                str(script),
                name,
                str(work),
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert f"scenario {name}: ok" in proc.stdout
        assert list((work / "tmp").glob("packtool-*")) == []  # scratch cleaned up
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
def test_s3_pack_and_readers() -> None:
    run_scenario("pack", timeout=600)


@pytest.mark.slow
def test_s3_kill_rerun_and_access_errors() -> None:
    run_scenario("faults", timeout=600)


@pytest.mark.slow
def test_s3_outages_fail_in_bounded_time_and_unfinished_uploads_are_aborted() -> None:
    run_scenario("outage", timeout=300)


@pytest.mark.slow
def test_s3_mixtures_keep_their_source_ids() -> None:
    run_scenario("mix", timeout=600)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_s3_two_ray_nodes_give_the_local_rows() -> None:
    run_scenario("ray", timeout=900)


def test_pre_tokenized_inputs_on_a_store_pack_as_local_ones(memory_prefix, tmp_path: Path) -> None:
    """Ids from a store: a Megatron .bin/.idx (read in ranged reads, not memory-mapped) and a
    Parquet file with labels give the rows of the same files on a local disk."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_units_inputs import write_megatron

    fs, name = memory_prefix
    rng = np.random.default_rng(3)
    docs = [rng.integers(3, 900, int(rng.integers(1, 120))).tolist() for _ in range(400)]
    prefix = write_megatron(tmp_path / "corpus_text_document", docs)
    labels = [[t if i % 3 else -100 for i, t in enumerate(d)] for d in docs]
    pq.write_table(pa.table({"ids": docs, "labels": labels}), tmp_path / "l.parquet",
                   row_group_size=50)  # fmt: skip
    for local in (Path(f"{prefix}.idx"), Path(f"{prefix}.bin"), tmp_path / "l.parquet"):
        fs.pipe_file(f"/{name}/in/{local.name}", local.read_bytes())
    cases = [
        (f"{prefix}.idx", {"max_len": 256, "pad_id": 0, "vocab_size": 1000}),
        (tmp_path / "l.parquet", {"max_len": 256, "pad_id": 0, "vocab_size": 1000,
                                  "ids_field": "ids", "labels_field": "labels"}),
    ]  # fmt: skip
    for i, (local, opts) in enumerate(cases):
        url = f"memory://{name}/in/{Path(local).name}"
        pack([str(local)], tmp_path / f"local{i}", **opts)
        pack([url], f"memory://{name}/out{i}", **opts)
        _, want = read_rows(tmp_path / f"local{i}")
        reader = packtool.open_packed(f"memory://{name}/out{i}")
        got = [reader[r].input_ids.tolist() for r in range(len(reader))]
        assert got == [row["input_ids"] for row in want]
        if "labels_field" in opts:
            assert reader[0].labels.tolist() == want[0]["labels"]


def test_chat_templates_on_a_store(memory_prefix, tmp_path: Path) -> None:
    """--chat-template as a URL, and a chat_template.jinja beside a tokenizer on a store, give
    the rows of the local template (a trial found both refused or crashing)."""
    fs, name = memory_prefix
    data = SAMPLE.parent
    template = (data / "chatml.jinja").read_bytes()
    bundled = REPO / "packtool" / "_data" / "tokenizer.json"
    fs.pipe_file(f"/{name}/chatml.jinja", template)
    fs.pipe_file(f"/{name}/tok/tokenizer.json", bundled.read_bytes())
    fs.pipe_file(f"/{name}/tok/chat_template.jinja", template)
    chat = [str(data / "chat.jsonl")]
    local = pack(chat, tmp_path / "local", max_len=2048, chat_template=data / "chatml.jinja")
    by_url = pack(
        chat, tmp_path / "url", max_len=2048, chat_template=f"memory://{name}/chatml.jinja"
    )
    beside = pack(chat, tmp_path / "beside", max_len=2048, tokenizer=f"memory://{name}/tok/")
    want = [s["sha256"] for s in local.manifest["shards"]]
    assert [s["sha256"] for s in by_url.manifest["shards"]] == want
    assert [s["sha256"] for s in beside.manifest["shards"]] == want
    with pytest.raises(Exception, match="no such chat template file"):
        pack(chat, tmp_path / "x", max_len=2048, chat_template=f"memory://{name}/nope.jinja")


def test_a_merge_on_a_store_names_the_store(memory_prefix) -> None:
    """Errors of a merge on a store name its prefix, not the local scratch copy it works in."""
    from packtool.merge import merge_units

    fs, name = memory_prefix
    fs.pipe_file(f"/{name}/out/notes.txt", b"not a unit")
    with pytest.raises(FormatError) as caught:
        merge_units(f"memory://{name}/out")
    assert str(caught.value).startswith(f"memory://{name}/out: no units to merge")
    assert "packtool-merge-" not in str(caught.value)


def test_a_merge_on_a_store_reads_no_shard(memory_prefix, tmp_path: Path) -> None:
    """The default merge on a store works from the units' manifests (their segment-length
    histograms) and writes only metadata: with every unit shard replaced on the store by bytes
    of the same size, it still merges (a read would fail), and `verify` then finds them."""
    from packtool.engines import pack_units
    from packtool.merge import merge_units
    from packtool.verification import verify

    fs, name = memory_prefix
    local = tmp_path / "units-out"
    for i in range(3):  # the units alone (as array tasks run them), no merge
        pack_units([SAMPLE], local, units=3, unit=i, max_len=2048)
    for path in (local / "units").rglob("*"):
        if path.is_file():
            rel = path.relative_to(local).as_posix()
            data = path.read_bytes()
            fs.pipe_file(
                f"/{name}/out/{rel}", b"\0" * len(data) if path.suffix == ".arrow" else data
            )
    report = merge_units(f"memory://{name}/out")
    merged = packtool.open_packed(f"memory://{name}/out").manifest
    assert merged.units is not None and merged.units.copied is False
    assert report.rows == merged.rows
    assert all(s.file.startswith("units/") for s in merged.shards)
    assert not [p for p in fs.ls(f"/{name}/out", detail=False) if p.endswith(".arrow")]
    assert merged.global_ffd_rows is not None and merged.global_ffd_rows <= merged.rows
    result = verify(f"memory://{name}/out")
    assert not result.ok and any("sha256" in p for p in map(str, result.problems))


@contextlib.contextmanager
def _shard_fetches(fs: Any) -> Iterator[list[str]]:
    """The shard files opened on the memory store ``fs`` while the block runs."""
    fetched: list[str] = []
    original = fs.open

    def counting_open(path: str, mode: str = "rb", **kw: Any) -> Any:
        if path.endswith(".arrow"):
            fetched.append(path)
        return original(path, mode, **kw)

    fs.open = counting_open
    try:
        yield fetched
    finally:
        fs.open = original


def test_a_shard_cache_fetches_each_shard_of_a_store_output_once(
    memory_prefix, tmp_path: Path
) -> None:
    """open_packed/PackedDataset with cache_dir: each shard fetched once, kept under its
    sha256 and mapped; rows equal the local output's in any order; a shard altered on the
    store is refused by its sha256 (one line naming it), and nothing half-copied stays."""
    pytest.importorskip("torch")
    from packtool.torch import PackedDataset

    fs, name = memory_prefix
    local = tmp_path / "local"
    packtool.pack([SAMPLE], local, max_len=512, rows_per_shard=40)
    url = f"memory://{name}/out"
    packtool.pack([SAMPLE], url, max_len=512, rows_per_shard=40)
    shards = open_packed(local).manifest.shards
    assert len(shards) > 3
    cache = tmp_path / "cache"
    with _shard_fetches(fs) as fetched:
        ds, ref = PackedDataset(url, cache_dir=cache), PackedDataset(local)
        order = np.random.default_rng(0).permutation(len(ref))
        for i in [*order, *order]:  # two shuffled passes
            assert all(np.array_equal(np.asarray(ds[i][k]), np.asarray(ref[i][k])) for k in ref[i])
    assert len(fetched) == len(shards)  # each shard read from the store once
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{s.sha256}.arrow" for s in shards)
    # A shard changed on the store (same size): a new cache refuses it by its sha256.
    first = f"/{name}/out/{shards[0].file}"
    data = bytearray(fs.cat_file(first))
    data[-100] ^= 0xFF
    fs.pipe_file(first, bytes(data))
    reader = open_packed(url, cache_dir=tmp_path / "cache2")
    with pytest.raises(FormatError, match=r"sha256 is .* the manifest records .*packtool verify"):
        reader[0]
    assert list((tmp_path / "cache2").iterdir()) == []


def test_a_store_glob_names_the_prefixes_it_matched_and_did_not_read(memory_prefix) -> None:
    """As for a local glob: `d/*` on a store reads the files it matches and names a matched
    prefix (a "directory") on the skipped: line instead of dropping it without a word."""
    from packtool.readers import describe_skipped, resolve_inputs

    fs, name = memory_prefix
    fs.pipe_file(f"/{name}/d/a.jsonl", b'{"text": "x"}\n')
    fs.pipe_file(f"/{name}/d/sub/b.jsonl", b'{"text": "y"}\n')
    skipped: list = []
    found = resolve_inputs([f"memory://{name}/d/*"], skipped=skipped)
    assert [str(i.path) for i in found] == [f"memory://{name}/d/a.jsonl"]
    assert [str(p) for p in skipped] == [f"memory://{name}/d/sub"]
    assert "1 directory matched by a pattern, not read" in describe_skipped(skipped)
    with pytest.raises(InputError, match=r"matches no files \(only directories: memory://"):
        resolve_inputs([f"memory://{name}/d/s*"])


def test_verify_of_a_store_output_downloads_each_shard_once(memory_prefix) -> None:
    """verify hashes a store shard as it downloads it and reads its rows from that copy (it
    downloaded every shard twice); an altered shard is still reported by its sha256 and its
    rows still checked."""
    from packtool.verification import verify

    fs, name = memory_prefix
    url = f"memory://{name}/out"
    packtool.pack([SAMPLE], url, max_len=512, rows_per_shard=40)
    shards = open_packed(url).manifest.shards
    with _shard_fetches(fs) as fetched:
        report = verify(url)
    assert report.ok, report.problems
    assert report.rows_checked == sum(s.rows for s in shards)
    assert len(fetched) == len(shards)  # each shard read from the store once
    first = f"/{name}/out/{shards[0].file}"
    data = bytearray(fs.cat_file(first))
    data[-100] ^= 0xFF
    fs.pipe_file(first, bytes(data))
    report = verify(url)
    assert "sha256" in {p.check for p in report.problems}, report.problems
    assert report.rows_checked == sum(s.rows for s in shards)
