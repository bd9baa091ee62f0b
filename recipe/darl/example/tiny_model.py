"""A tiny Qwen3-architecture causal LM and a character-level tokenizer, built offline.

`build_tiny_model(path)` writes an untrained Hugging Face checkpoint (float32 weights from `seed`) with a
`WordLevel` tokenizer of one token per printable ASCII character, Qwen-style special tokens and a ChatML template.
`model_type` must stay `qwen3` and `tokenizer_config.json` must name `PreTrainedTokenizerFast`: with `qwen2`,
`AutoTokenizer` swaps a WordLevel tokenizer for Qwen2's byte-level BPE.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Union

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END, UNK_TOKEN)
# every printable ASCII character (letters, digits, punctuation, space) plus newline and tab
CHARACTERS = tuple(sorted(set(string.printable) - {"\r", "\x0b", "\x0c"}))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():
    """The character-level tokenizer as a `transformers.PreTrainedTokenizerFast` (not yet saved)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # one token per character, spaces and newlines included; decoding concatenates without separators
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD_TOKEN, eos_token=IM_END, unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START], model_max_length=4096, padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(path: Union[str, os.PathLike], seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> str:
    """Writes the tiny model and its tokenizer to `path` and returns it; deterministic, global RNG untouched.
    The model: 4 query heads, 2 key-value heads, MLP 4x wide."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    if hidden_size % 4:
        raise ValueError(f"build_tiny_model: hidden_size must be a multiple of 4, got {hidden_size}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer()
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD_TOKEN, IM_END])
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=pad_id, eos_token_id=eos_id,
        bos_token_id=None, torch_dtype="float32",
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)

    # AutoTokenizer must build the WordLevel tokenizer as is (see the module docstring)
    config_file = path / "tokenizer_config.json"
    tokenizer_config = {**json.loads(config_file.read_text()), "tokenizer_class": "PreTrainedTokenizerFast",
                        "chat_template": CHAT_TEMPLATE}
    config_file.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    return str(path)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    args = parser.parse_args()
    print(build_tiny_model(args.path, seed=args.seed, hidden_size=args.hidden_size, num_layers=args.num_layers))
