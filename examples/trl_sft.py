"""TRL's SFTTrainer on packtool's pre-packed chat rows, with packtool's assistant-only labels.

    packtool pack sample_data/chat.jsonl --chat-template sample_data/chatml.jinja -L 512 -o chat/
    python examples/trl_sft.py chat/ --steps 10

The rows are already tokenized, packed and labelled (each assistant turn with its end-of-turn
token, -100 elsewhere), so TRL must not touch them. Three SFTConfig settings see to it:

- ``dataset_kwargs={"skip_prepare_dataset": True}``: no re-tokenizing, no re-packing;
- ``max_length=None``: no truncation (the rows are ``max_len`` long already);
- ``remove_unused_columns=False``: TRL would keep only ``input_ids``, ``labels`` and
  ``seq_lengths``, dropping the ``position_ids`` that keep the documents apart.

``collate`` is the data collator (the boundaries, the labels, no KV cache). docs/trl.md.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import datasets
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

import packtool
from packtool.torch import collate


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a packtool output of chat or prompt/completion records")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--output-dir", default="trl-sft-run")
    args = p.parse_args(argv)

    packed = packtool.open_packed(args.data)
    assert packed.has_labels, f"{args.data} has no labels: pack chat or prompt/completion data"
    special = packed.manifest.tokenizer.special  # the ids as used
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(packed.path / "tokenizer.json"))
    tokenizer.pad_token_id = special.pad_id  # TRL asks for one; the rows are padded already
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=packed.vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=packed.max_len,
            pad_token_id=special.pad_id,
        )
    )
    # -- the user code ----------------------------------------------------------------------
    config = SFTConfig(
        output_dir=args.output_dir,
        max_steps=args.steps,
        learning_rate=1e-3,
        save_strategy="no",
        dataset_kwargs={"skip_prepare_dataset": True},  # packtool tokenized and packed
        max_length=None,  # never truncate the rows
        remove_unused_columns=False,  # keep position_ids
        bf16=torch.cuda.is_available(),  # TRL's default bf16=True needs a GPU
    )
    train = datasets.load_from_disk(args.data)  # TRL takes a `datasets.Dataset`: the shards
    trainer = SFTTrainer(
        model, config, train_dataset=train, data_collator=collate, processing_class=tokenizer
    )
    result = trainer.train()
    # ------------------------------------------------------------------------------------------

    assert result.global_step == args.steps
    assert math.isfinite(result.training_loss)
    # TRL's loss is the loss over packtool's labels (assistant turns only), computed here by
    # transformers from collate's batch: had TRL re-tokenized, truncated or built its own
    # labels, or lost position_ids, they would differ.
    sample = train.select(range(min(8, len(train))))
    trl_loss = trainer.evaluate(sample)["eval_loss"]
    model.eval()
    with torch.no_grad():
        batch = collate(list(sample))
        ours = model(
            **{k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        )
    assert abs(trl_loss - ours.loss.item()) < 1e-4, (trl_loss, ours.loss.item())
    print(f"{args.steps} steps: train loss {result.training_loss:.3f}; eval loss {trl_loss:.4f}")
    return {"train_loss": result.training_loss, "eval_loss": trl_loss}


if __name__ == "__main__":
    main()
