"""Fingerprints of the input files that define a run beside its config: part of the run identity.

The config names ``data.prompts``, ``model.pretrained_path`` and ``reward.weights_path`` by path; a resume
with the same path but other content would silently train on other prompts or from other weights. Rank 0
fingerprints them at startup (:func:`input_fingerprints`), every checkpoint records the result, and a
resume whose fingerprints differ is refused naming the key and both values (:func:`input_differences`).

* ``data.prompts`` and ``data.eval_prompts``: sha256 of the prompts and their metadata as the reader reads
  them (blank lines and surrounding spaces, which the reader drops, do not count), built-in sets included.
* a weights directory: hashing tens of GB at every start is too slow, so sha256 over every file's relative
  name, size and three 64 KiB samples (start, middle, end). Another checkpoint of the same architecture
  differs in every sample; a copy of the folder (new modification times) keeps its fingerprint. An edit
  of a few bytes between the samples is not seen.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from digenrl.config import Config

_SAMPLE = 64 * 1024


def input_paths(cfg: Config) -> dict[str, str | None]:
    """The input keys that define a run beside its config, with their values."""
    return {
        "data.prompts": cfg.data.prompts,
        "data.eval_prompts": cfg.data.eval_prompts,
        "model.pretrained_path": cfg.model.pretrained_path,
        "reward.weights_path": cfg.reward.weights_path,
    }


def input_fingerprints(cfg: Config) -> dict[str, str | None]:
    """``{key: fingerprint}`` for :func:`input_paths` (``None``: the key is unset)."""
    from digenrl.data.prompts import configured_prompt_sets

    sets = configured_prompt_sets(cfg.data)
    return {
        **{key: _prompt_set_fingerprint(s.prompts, s.metadata) for key, s in sets.items()},
        "model.pretrained_path": _directory_fingerprint(cfg.model.pretrained_path),
        "reward.weights_path": _directory_fingerprint(cfg.reward.weights_path),
    }


def _prompt_set_fingerprint(prompts: tuple[str, ...], metadata: tuple) -> str:
    rows = [json.dumps([p, dict(m)], sort_keys=True) for p, m in zip(prompts, metadata, strict=True)]
    return "sha256:" + hashlib.sha256("\n".join(rows).encode()).hexdigest()


def _directory_fingerprint(path: str | None) -> str | None:
    if path is None:
        return None
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(root) if root.is_dir() else file.name}\0{size}\0".encode())
        with file.open("rb") as stream:
            for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
                stream.seek(offset)
                digest.update(stream.read(_SAMPLE))
    return f"sampled-sha256:{digest.hexdigest()}"


def input_differences(saved: dict[str, str | None], current: dict[str, str | None], cfg: Config) -> list[str]:
    """A line per key whose fingerprint differs, naming both (keys a checkpoint did not record, e.g. one
    written before fingerprints existed, are not compared)."""
    paths = input_paths(cfg)
    return [
        f"{key}={paths[key]!r}: its content is {current.get(key)} now, {saved[key]} in the checkpoint"
        for key in paths
        if key in saved and saved[key] != current.get(key)
    ]
