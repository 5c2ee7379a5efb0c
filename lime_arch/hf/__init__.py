"""The Hugging Face ``transformers`` face of a LIMe model: ``LimeConfig`` and ``LimeForCausalLM``.

These two files are what ``lime export`` copies into an export folder as ``configuration_lime.py``
and ``modeling_lime.py``, so that ``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`` loads the model (``orchestrator.export``). The modeling code wraps
``lime_arch.LIMeDecoder`` itself: the export needs this project (``lime_arch``) importable where
it is loaded, and in exchange computes exactly the project's logits for every router and depth
mix. Nothing here is imported by the rest of ``lime_arch`` (transformers is optional).
"""
