"""The schedules: baselines and DigenRL, built from the same phases (DESIGN.md §4).

Each system lives in its own module and is looked up by name here; modules are imported lazily so
that ``digenrl.config`` can validate a system name without importing torch-heavy code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from digenrl.config import Config

_SYSTEMS: dict[str, str] = {
    "colocated-sync": "digenrl.systems.colocated_sync:ColocatedSync",
    "colocated-overlap": "digenrl.systems.colocated_overlap:ColocatedOverlap",
    "separate-sync": "digenrl.systems.separate_sync:SeparateSync",
    "separate-async": "digenrl.systems.separate_async:SeparateAsync",
    "digenrl": "digenrl.systems.digenrl_system:DigenRL",
}


def available_systems() -> list[str]:
    return sorted(_SYSTEMS)


def get_system(name: str) -> type:
    """The system class registered under ``name``."""
    if name not in _SYSTEMS:
        raise ValueError(f"system={name!r} is not allowed; choose one of: {', '.join(available_systems())}")
    module, cls = _SYSTEMS[name].split(":")
    return getattr(importlib.import_module(module), cls)


@dataclass(frozen=True)
class SystemRequirements:
    """Start-up checks a system needs beyond the config's own (checked before any model is built)."""

    name: str
    prompts_divisible_by_world: bool = True

    def check(self, cfg: Config, world_size: int) -> None:
        from digenrl.config import ConfigError

        p = cfg.algo.prompts_per_iteration
        if self.prompts_divisible_by_world and p % world_size:
            raise ConfigError(
                f"algo.prompts_per_iteration={p} must be divisible by the {world_size} ranks of system="
                f"{self.name!r}, so every rank generates whole prompt groups"
            )


def system_requirements(name: str) -> SystemRequirements:
    return get_system(name).requirements
