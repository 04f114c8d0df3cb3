"""The stand-in checkpoint on the simulated hosts: the files a real one has,
tiny, and enough for NVIDIA's Dynamo frontend and engine simulator to serve it.

What Dynamo reads from a model directory (../shared/recipes/dynamo-real.md):
``config.json`` (layers, heads and head size set the KV bytes per token),
``tokenizer.json`` (the frontend tokenizes every request with it), and a chat
template (``tokenizer_config.json`` "chat_template"): without a template the
frontend never registers the model. The tokenizer is a byte-level BPE
tokenizer trained offline in a fraction of a second on a small fixed text
with the ``tokenizers`` library (Hugging Face's, as the real checkpoints'
tokenizer.json files are written by), with Qwen's special tokens.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ARCHITECTURE = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Qwen's ChatML, without tools
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB = 2048
# What the tokenizer learns from: a few modules of Python's own library, the
# same text wherever the simulator runs. Enough text to reach VOCAB merges: a
# tokenizer with a few hundred tokens makes the mock engine's random tokens
# decode to nothing (the frontend answers "content": null; seen here).
CORPUS_MODULES = ["argparse", "textwrap", "json.decoder", "json.encoder", "string", "shlex", "fnmatch", "calendar"]


def corpus() -> list[str]:
    import importlib

    out = []
    for name in CORPUS_MODULES:
        out += Path(importlib.import_module(name).__file__).read_text().splitlines()
    return out


@lru_cache(maxsize=1)
def tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok.to_str()


def files() -> dict[str, str]:
    """name -> content of the stand-in checkpoint (safetensors shards of zeros)."""
    tj = tokenizer_json()
    vocab = json.loads(tj)["model"]["vocab"]
    config = {**ARCHITECTURE, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "hidden_size": 256, "vocab_size": len(vocab), "max_position_embeddings": 262144,
              "eos_token_id": vocab.get("<|im_end|>"), "torch_dtype": "bfloat16"}
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    out = {
        "config.json": json.dumps(config) + "\n",
        "generation_config.json": json.dumps({"do_sample": True, "temperature": 0.6}) + "\n",
        "tokenizer.json": tj,
        "tokenizer_config.json": json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                             "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 262144}) + "\n",
        "model.safetensors.index.json": json.dumps({"weight_map": {"lm_head.weight": shards[1], "embed.weight": shards[0]}}) + "\n",
    }
    for i, shard in enumerate(shards):
        out[shard] = "\0" * (4096 * (i + 1))
    return out


def write(model_dir: Path, write_file) -> None:
    for name, text in files().items():
        write_file(model_dir / name, text)
