"""Make a tiny random-weight Qwen2 judge model for the real-engine lane, offline, in seconds.

Why: the lane runs real SGLang on two CPU cores, so the model must be small enough to answer in about
a tenth of a second, and nothing may come from a model hub. A byte-level BPE tokenizer is trained on
a few sentences (with ChatML specials and template, so chat completions work), and a 2-layer Qwen2 is
initialised from ``--seed``: two seeds give two models with the same shape and different weights,
which is what a verification test needs. Runs in the engine's environment (torch, transformers).

Usage: python tiny_model.py OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Rate the answer from 1 to 10. The answer is correct and complete.",
    "You are a careful judge. Compare response A with response B and say which is better.",
    "The proof is wrong in step two; the score is 3. The code passes every test; the score is 9.",
    "Question: what is 2 + 2? Answer: 4. Verdict: correct. Reward: 1.0",
    "def add(a, b): return a + b  # a short function, well named, with no side effects",
    "0123456789 .,;:!?()[]{}<>-+=*/'\" abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


def tokenizer() -> PreTrainedTokenizerFast:
    """A 512-entry byte-level BPE: every byte is representable, so any prompt tokenizes."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, chat_template=CHAT_TEMPLATE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tok = tokenizer()
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
