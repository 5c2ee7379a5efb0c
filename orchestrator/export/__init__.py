"""``lime export``: a trained model as a Hugging Face ``transformers`` causal-LM folder
(``orchestrator.export.hf``), with its tokenizer (``orchestrator.export.tokenizer``)."""
