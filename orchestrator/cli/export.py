"""``lime export <MLflow run id | checkpoint> --to DIR``: a Hugging Face transformers folder
(``orchestrator.export.hf``: weights, config, tokenizer and the modeling code)."""
from __future__ import annotations

from orchestrator.core.outputs import check_out_folder
from orchestrator.export.hf import export
from orchestrator.sweep.checkpoints import resolve_target


def cmd_export(args) -> int:
    check_out_folder(args.to, "--to", empty=True)  # before the checkpoint is read
    path, run_id = resolve_target(args.target)
    files = export(path, args.to, run_id=run_id)
    for f in files:
        print(f"wrote {f}")
    print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(args.to)!r}, trust_remote_code=True) "
          "(needs lime_arch importable)")
    return 0
