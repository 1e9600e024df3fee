"""A tiny Llama-style model directory made on the spot, for serving with `--load-format dummy`.

SGLang needs a config.json, a tokenizer and a chat template to serve chat completions; with dummy
weights it needs no weight files. The tokenizer is a byte-level BPE trained here on a generated
corpus, so nothing is downloaded and the directory is the same on every run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL_TOKENS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# Roles and end-of-turn as the special tokens above; add_generation_prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCABULARY = ("the a one two three four five six seven eight nine ten say hello world count from to and or "
              "answer question model server prefill decode router cache token request reply quick brown fox "
              "jumps over lazy dog why how what when where which who is are was were be this that it")
WORDS = VOCABULARY.split()


def _corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))).capitalize() + "."
            for _ in range(lines)]


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def llama_config(vocab_size: int, bos: int, eos: int, context_length: int) -> dict:
    # 2 layers, 4 query heads over 2 KV heads (GQA, as real models), head_dim 64, bf16.
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": context_length,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
    }


def make_tiny_model(directory: Path, *, vocab_size: int = 1024, context_length: int = 4096) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    tokenizer.save(str(directory / "tokenizer.json"))
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    files = {
        "config.json": llama_config(tokenizer.get_vocab_size(), bos, eos, context_length),
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "model_max_length": context_length,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>"},
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return directory
