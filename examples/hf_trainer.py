"""Hugging Face Trainer on a packtool output: the dataset and the collator as they are, default
TrainingArguments (remove_unused_columns=True and all), a tiny Llama from config, CPU.

    packtool pack sample_data/corpus.jsonl --max-len 256 -o out/
    python examples/hf_trainer.py out/ --steps 10

What makes it right, with nothing to configure: ``PackedDataset`` items carry ``input_ids``,
``position_ids`` and ``labels``, the keys Trainer keeps; ``collate`` finds the documents where
``position_ids`` restart, masks labels at document starts and padding, and turns the KV cache
off, so every document attends only to itself (docs/hf_trainer.md).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import torch
from torch.utils.data import Subset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from packtool.torch import PackedDataset, collate


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a packtool output directory")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--output-dir", default="hf-trainer-run")
    args = p.parse_args(argv)

    train = PackedDataset(args.data)
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=train.reader.vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=train.max_len,
        )
    )
    # -- the user code: the dataset, the collator, default arguments (but a short run) --------
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, learning_rate=1e-3, save_strategy="no"
    )
    trainer = Trainer(model, training_args, train_dataset=train, data_collator=collate)
    sample = Subset(train, range(min(16, len(train))))
    before = trainer.evaluate(sample)["eval_loss"]
    result = trainer.train()
    after = trainer.evaluate(sample)["eval_loss"]
    # ------------------------------------------------------------------------------------------

    assert result.global_step == args.steps
    assert math.isfinite(result.training_loss)
    assert abs(before - math.log(train.reader.vocab_size)) < 1.0, before  # a random start
    assert after < before, (before, after)  # it learned
    print(f"{args.steps} steps: eval loss {before:.3f} -> {after:.3f}")
    return {"before": before, "after": after, "train_loss": result.training_loss}


if __name__ == "__main__":
    main()
