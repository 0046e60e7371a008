"""Export a run's trained policy where diffusers, peft and ComfyUI load it (docs/export.md).

    python experiments/export.py runs/tiny --format diffusers --out exports/tiny-lora
    python experiments/export.py runs/tiny --step 20 --ema --format peft --out exports/tiny-peft
    python experiments/export.py runs/tiny --format diffusers --pipeline --out exports/tiny-pipeline
    python experiments/export.py runs/tiny --format kohya --out exports/tiny-comfyui

``--format diffusers``: a LoRA as ``pytorch_lora_weights.safetensors`` with its adapter config
(``pipe.load_lora_weights(DIR)``), a full fine-tune's transformer via ``save_pretrained``; ``--format peft``:
``adapter_config.json`` + ``adapter_model.safetensors`` (``PeftModel.from_pretrained(transformer, DIR)``);
``--format kohya``: ``lora_kohya.safetensors`` with kohya's ``lora_down`` / ``lora_up`` / ``alpha`` keys
for ComfyUI (SD3, FLUX); ``--pipeline``: a whole diffusers pipeline directory. Bad input exits with
status 2 (digenrl/export/cli.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import digenrl  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.export import main

if __name__ == "__main__":
    raise SystemExit(main())
