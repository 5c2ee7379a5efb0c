"""``LimeForCausalLM``: a ``lime_arch.LIMeDecoder`` as a transformers causal LM. Copied into
export folders as ``modeling_lime.py``; needs ``lime_arch`` (this project) importable.

- ``forward(input_ids, attention_mask=None, labels=None)`` returns the decoder's logits (and the
  mean next-token loss with ``labels``, -100 ignored). The decoder has no padding mask: rows that
  are left-padded (a mask whose ones do not start at position 0, as batched generation pads) are
  run one by one on their real tokens, so every row sees exactly its own tokens at positions 0..;
  right padding cannot change a causal model's logits of the tokens before it.
- Generation recomputes the whole prefix each step (``use_cache`` is off: the decoder's own KV
  cache is not transformers' cache object); correct, and fast enough for evaluation-sized models.
- The state dict is the decoder's under ``model.``; with tied embeddings ``model.lm_head.weight``
  is ``model.embed.weight``.
- Building it checks the installed ``lime_arch`` against the one the export recorded
  (``config.lime_code``; ``lime_arch.code_version``): other model code gives one line as a
  ``LimeCodeVersionWarning``, since the logits may differ from the trained model's.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from lime_arch.config import ModelConfig
from lime_arch.model import LIMeDecoder, rope_cache

from .configuration_lime import LimeConfig

try:  # a lime_arch older than the version records cannot check; say so on load instead of failing
    from lime_arch import code_version
except ImportError:  # pragma: no cover - only with an old lime_arch installed
    code_version = None


class LimeForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LimeConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: LimeConfig):
        super().__init__(config)
        _check_code(getattr(config, "lime_code", None))
        self.model = LIMeDecoder(ModelConfig.from_dict(config.lime))
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
        self.post_init()

    def _init_weights(self, module):
        # the decoder initialises its own weights; what loading leaves to set are the RoPE tables
        # (buffers, not saved), recomputed in float64 as the decoder keeps them
        if isinstance(module, LIMeDecoder):
            c = module.cfg
            cos, sin = rope_cache(c.head_dim, c.max_seq_len, c.rope_theta)
            module.rope_cos, module.rope_sin = cos.to(module.rope_cos.device), sin.to(module.rope_sin.device)

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        logits = self._logits(input_ids, attention_mask)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def _logits(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None or bool(mask.all()):
            return self.model(ids)
        starts = mask.long().argmax(-1)  # the first real token of each row
        if bool((starts == 0).all()):
            return self.model(ids)  # right padding only
        out = torch.zeros(*ids.shape, self.config.vocab_size, dtype=self.dtype, device=ids.device)
        for r in range(ids.shape[0]):
            keep = mask[r].bool()
            out[r, keep] = self.model(ids[r:r + 1, keep])[0].to(out.dtype)
        return out

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def _check_code(recorded: dict | None) -> None:
    if code_version is None:
        warnings.warn("the installed lime_arch predates code version records: cannot check that it is the code "
                      "this model was exported with", UserWarning, stacklevel=3)
        return
    problem = code_version.check(recorded)
    if problem:
        warnings.warn(problem, code_version.LimeCodeVersionWarning, stacklevel=3)
