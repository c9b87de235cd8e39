"""A real engine nobody here wrote: llama.cpp's ``llama-server`` serving a tiny Llama.

:func:`write_tiny_llama` writes a random-weight Llama model as GGUF with the ``gguf`` package
(no download): a SentencePiece-style vocabulary that llama.cpp's tokenizer accepts (the
three special tokens, the 256 byte tokens ``<0xNN>`` it falls back to, printable ASCII, and
letter pairs with and without the word-start mark ``▁``), a plain chat template, and
weights drawn from a seeded generator, so every run writes the same file.  One direction of
the residual stream carries a large constant, and the output rows of the special and byte
tokens point against it: the model never samples an end of text or a lone byte, so a
request with ``max_tokens`` N generates N tokens of printable text, one streamed chunk each.

:func:`start_llama_server` runs the binary that :mod:`harness.llama_build` builds (and
builds it first on a machine that has none) on loopback, through
:func:`velvetrope.serving.launch.start`: ``--parallel`` slots, continuous batching,
``--metrics``, and ``/health`` as the readiness check.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np

from harness.llama_build import ensure_llama_server
from velvetrope.serving.launch import ServerProcess, free_port, start

__all__ = [
    "MODEL_NAME",
    "TinyLlama",
    "gateway_config",
    "start_llama_server",
    "write_tiny_llama",
]

MODEL_NAME = "tiny-llama"
"""The model id llama-server lists (``--alias``)."""

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class TinyLlama:
    """The model's shape: about 29M parameters (f16 matrices), a few milliseconds a token on
    one core: small enough to write in seconds, slow enough that a request of a few hundred
    tokens lasts long enough to see it stopped."""

    n_embd = 512
    n_layer = 8
    n_head = 8
    n_ff = 1536
    n_ctx_train = 4096


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (1 normal, 2 unknown, 3 control, 6 byte)."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    chars = [c for c in string.printable if c not in " \t\n\r\x0b\x0c"] + ["▁"]
    letters = string.ascii_lowercase
    words = chars + [a + b for a in letters for b in letters]
    words += ["▁" + a for a in letters] + ["▁" + a + b for a in letters for b in letters]
    tokens += words
    types += [1] * len(words)
    # longer pieces score higher: the tokenizer merges them first
    scores = [0.0] * 259 + [-1000.0 + len(w) for w in words]
    return tokens, scores, types


def write_tiny_llama(path: Path, seed: int = 7) -> Path:
    """Write the model to ``path`` (GGUF: f16 matrices, f32 norms and embeddings) and
    return ``path``."""
    import gguf  # a test dependency: imported here so that importing this module is cheap

    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    m = TinyLlama
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float16)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(MODEL_NAME)
    w.add_context_length(m.n_ctx_train)
    w.add_embedding_length(m.n_embd)
    w.add_block_count(m.n_layer)
    w.add_feed_forward_length(m.n_ff)
    w.add_head_count(m.n_head)
    w.add_head_count_kv(m.n_head)
    w.add_rope_dimension_count(m.n_embd // m.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(1)  # mostly f16
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)

    embd = rand(n_vocab, m.n_embd, scale=0.5).astype(np.float32)
    embd[:, 0] = 20.0  # the constant direction (see the module docstring)
    out = rand(n_vocab, m.n_embd, scale=0.5)
    out[:, 0] = 0.0
    out[:259, :] = 0.0
    out[:259, 0] = -50.0  # special and byte tokens: far below every printable one
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(m.n_embd, dtype=np.float32))
    w.add_tensor("output.weight", out)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(m.n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(m.n_embd, m.n_embd))
        w.add_tensor(p + "attn_k.weight", rand(m.n_embd, m.n_embd))
        w.add_tensor(p + "attn_v.weight", rand(m.n_embd, m.n_embd))
        w.add_tensor(p + "attn_output.weight", rand(m.n_embd, m.n_embd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(m.n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(m.n_ff, m.n_embd))
        w.add_tensor(p + "ffn_up.weight", rand(m.n_ff, m.n_embd))
        w.add_tensor(p + "ffn_down.weight", rand(m.n_embd, m.n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def start_llama_server(
    model: Path,
    *,
    slots: int = 4,
    ctx_per_slot: int = 1024,
    threads: int = 1,
    extra: tuple[str, ...] = (),
) -> ServerProcess:
    """``llama-server`` on a free loopback port with ``slots`` parallel slots of
    ``ctx_per_slot`` tokens each, continuous batching and ``--metrics``; returns once
    ``/health`` answers 200 (the model is loaded)."""
    binary = ensure_llama_server(quiet=False)
    port = free_port()
    args = [
        "--model",
        str(model),
        "--alias",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(slots * ctx_per_slot),
        "--cont-batching",
        "--metrics",
        "--threads",
        str(threads),
        "--no-webui",
        *extra,
    ]
    return start(args, f"http://127.0.0.1:{port}", "/health", 120.0, program=[str(binary)])


def gateway_config(
    engine: str, admin_token: str, keys: tuple[str, str], burst: float, slots: int
) -> dict[str, Any]:
    """``velvetrope serve``'s config in front of ``engine``: tenants ``gold`` (interactive)
    and ``bronze`` (batch) with the API ``keys`` in that order, each with a token bucket of
    ``burst`` tokens that refills so slowly (0.01 token/s) that what was charged can be read
    off its level; one pool running ``slots`` requests at once (the engine's slots)."""
    slow = {"tokens_per_minute": 0.6, "token_burst": burst}
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "admin_token": admin_token,
        "api_keys": [{"tenant": "gold", "key": keys[0]}, {"tenant": "bronze", "key": keys[1]}],
        "policy": {
            "preset": "hybrid",
            "tiers": [{"name": "interactive"}, {"name": "batch"}],
            "tenants": [
                {"name": "gold", "tier": "interactive", "limits": slow},
                {"name": "bronze", "tier": "batch", "limits": slow},
            ],
            "pools": [{"name": "default", "max_in_flight": slots}],
        },
        "upstreams": {"default": [{"url": engine}]},
    }
