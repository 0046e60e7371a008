"""The schedules: baselines and DigenRL, built from the same phases (docs/design.md §4).

Each system lives in its own module and is looked up by name here. A system class declares the knobs
it honours (``System.knobs``) and its start-up checks (``System.check``); :mod:`digenrl.validation` runs
them before any process group or model exists.
"""

from __future__ import annotations

import importlib

_SYSTEMS: dict[str, str] = {
    "colocated-sync": "digenrl.systems.colocated_sync:ColocatedSync",
    "colocated-overlap": "digenrl.systems.colocated_overlap:ColocatedOverlap",
    "colocated-engine": "digenrl.systems.colocated_engine:ColocatedEngine",
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
