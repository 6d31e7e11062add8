"""A minimal training loop on a packtool output: a tiny Llama from config, a few steps, CPU.

    pip install -e '.[torch]' transformers   # no GPU: a CPU build of torch first, see docs
    packtool pack sample_data/corpus.jsonl --max-len 256 -o out/
    python examples/train.py out/ --steps 20

It shows the three things a packed training loop must get right:

1. attention inputs: with flash-attn installed (and a GPU), the FlashAttention varlen keywords
   ``cu_seq_lens_q/k`` and ``max_length_q/k`` from :func:`packtool.torch.collate`; otherwise
   SDPA with the boolean block-diagonal mask from :func:`packtool.torch.block_causal_mask`.
   ``position_ids`` restart at every document in both cases, and ``use_cache=False``;
2. labels: ``collate`` sets -100 on padding and on every document's first token;
3. loss normalisation: every optimizer step sums the loss over all micro-batches of the
   gradient-accumulation window and divides by the learned tokens of the whole window
   (``num_learned_tokens``), so every token weighs the same however the documents were packed.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from packtool.torch import IGNORE_INDEX, PackedDataset, block_causal_mask, collate


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a packtool output directory")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=2, help="packed rows per micro-batch")
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny model")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def flash_attention_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def model_inputs(batch: dict[str, Any], use_flash: bool, device: torch.device) -> dict[str, Any]:
    """The attention inputs of a collated batch, for FlashAttention varlen or for SDPA."""
    inputs: dict[str, Any] = {
        "input_ids": batch["input_ids"].to(device),
        "position_ids": batch["position_ids"].to(device),
        "use_cache": False,  # with a cache, transformers stops treating the rows as packed
    }
    if use_flash:
        # No attention_mask: the varlen kernel takes the boundaries over the flattened batch.
        for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            value = batch[key]
            inputs[key] = value.to(device) if isinstance(value, torch.Tensor) else value
    else:
        max_len = batch["input_ids"].shape[1]
        inputs["attention_mask"] = block_causal_mask(batch["cu_seq_lens_q"], max_len, device=device)
    return inputs


def batches(loader: DataLoader) -> Iterator[dict[str, Any]]:
    """Micro-batches forever, a new shuffle every epoch."""
    while True:
        yield from loader


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train; returns the loss per learned token of every optimizer step."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_flash = flash_attention_available()

    dataset = PackedDataset(args.data)
    vocab_size = dataset.reader.vocab_size
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=dataset.max_len,
        use_cache=False,
    )
    model = LlamaForCausalLM._from_config(
        config,
        attn_implementation="flash_attention_2" if use_flash else "sdpa",
        dtype=torch.bfloat16 if use_flash else torch.float32,  # flash-attn needs 16-bit
    ).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=collate,
        drop_last=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    stream = batches(loader)
    print(
        f"{len(dataset):,} rows of {dataset.max_len}; "
        f"attention: {'flash_attention_2 (varlen)' if use_flash else 'sdpa + block mask'}"
    )

    losses = []
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        window = list(itertools.islice(stream, args.grad_accum))
        learned = sum(b["num_learned_tokens"] for b in window)  # the whole window's tokens
        # (with data parallelism: all-reduce `learned` over ranks and multiply the loss by the
        # world size, since DDP averages the gradients)
        step_loss = 0.0
        per_source = torch.zeros(2, len(dataset.sources or ()))  # loss sums, tokens
        for batch in window:
            logits = model(**model_inputs(batch, use_flash, device)).logits
            labels = batch["labels"].to(device)
            # logits[t] predicts labels[t + 1]; the sum over the window / learned = mean per token
            token_loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(),
                labels[:, 1:].flatten(),
                ignore_index=IGNORE_INDEX,
                reduction="none",
            )
            loss = token_loss.sum() / learned
            loss.backward()
            step_loss += loss.item()
            if "source_ids" in batch:  # a mixture (pack --mix): the loss of each source
                source = batch["source_ids"][:, 1:].flatten()  # the source of each label
                learned_mask = labels[:, 1:].flatten().cpu() != IGNORE_INDEX
                for i in range(per_source.shape[1]):
                    mine = learned_mask & (source == i)
                    per_source[0, i] += token_loss.detach().cpu()[mine].sum()
                    per_source[1, i] += mine.sum()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
        by_source = "".join(
            f"  {Path(s.path).stem} {per_source[0, i] / per_source[1, i]:.4f}"
            for i, s in enumerate(dataset.sources or ())
            if per_source[1, i] > 0
        )
        print(
            f"step {step:>4}  loss {step_loss:.4f}  learned tokens {learned:,}  "
            f"{time.perf_counter() - started:.2f} s{by_source}"
        )
    return losses


if __name__ == "__main__":
    main()
