"""``LimeConfig``: a LIMe model's ``lime_arch.ModelConfig`` (names and numbers) as a transformers
config (``model_type: lime``), with the standard names tools read (vocabulary, context, width,
depth, heads, tied embeddings, special tokens) and ``lime_code``, the ``lime_arch`` it was
exported with (``lime_arch.code_version``; checked on load). Copied into export folders as
``configuration_lime.py``."""
from __future__ import annotations

from transformers import PretrainedConfig


class LimeConfig(PretrainedConfig):
    model_type = "lime"

    def __init__(self, lime: dict | None = None, lime_code: dict | None = None, **kwargs):
        self.lime = dict(lime or {})  # lime_arch.ModelConfig.to_dict()
        self.lime_code = dict(lime_code) if lime_code else None  # lime_arch.code_version.code_version()
        m = self.lime
        for name, key in (("vocab_size", "vocab_size"), ("max_position_embeddings", "max_seq_len"),
                          ("hidden_size", "d_model"), ("num_hidden_layers", "n_layers"),
                          ("num_attention_heads", "n_heads"), ("intermediate_size", "ffn_dim")):
            if key in m:
                kwargs.setdefault(name, m[key])
        if "n_heads" in m:
            kwargs.setdefault("num_key_value_heads", m.get("n_kv_heads") or m["n_heads"])
        kwargs.setdefault("tie_word_embeddings", bool(m.get("tie_embeddings", True)))
        kwargs.setdefault("use_cache", False)  # generation recomputes the prefix (see LimeForCausalLM)
        super().__init__(**kwargs)
