"""The model families of the zoo, one module each; each defines `FAMILY`, a `ModelFamily` (`family.py`)
registered in `specs.py`, and holds the family's zoo entries as data.

Published entries: transformer and VAE dicts are the `config.json` files of the diffusers repositories on
the Hugging Face hub (stabilityai/stable-diffusion-3.5-medium, black-forest-labs/FLUX.1-dev, Qwen/Qwen-Image,
Wan-AI/Wan2.1-T2V-{1.3B,14B}-Diffusers, hunyuanvideo-community/HunyuanVideo), minus bookkeeping keys
(`_class_name`, `_diffusers_version`). Text-encoder dicts are the transformers configs of the encoders
those pipelines load. Parameter counts of the transformers, instantiated on the meta device, match
docs/algorithm.md, "Model configurations" (tests/models/test_specs.py): SD3.5-M 2.243 B, FLUX.1-dev
11.901 B, Qwen-Image 20.430 B, Wan2.1-1.3B 1.419 B, Wan2.1-14B 14.288 B, HunyuanVideo 12.821 B.
Sampling defaults: train-time steps / eval steps / CFG from docs/algorithm.md, "Rollout settings" (FlowGRPO
configs); schedule shifts from each repository's `scheduler/scheduler_config.json`; prompt lengths,
templates and hidden-state indices from the diffusers pipelines (diffusers 0.42).

Tiny entries (`tiny-<family>`): the same diffusers / transformers classes at toy sizes, so the whole system
(rollout, training, distributed schedules) runs on CPU in tests and examples. Each keeps its family's
structure (SD3 dual-attention block, FLUX double + single blocks with guidance embedding, Qwen-Image packing
and text mask, Wan 3D patches, HunyuanVideo token refiner + pooled CLIP) and its family's VAE class with
real scaling statistics, so every code path of the family is exercised. `shared.py` holds what several
families use.
"""
