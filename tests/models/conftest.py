"""Shared tiny bundles: built once per test session (read-only use; tests that mutate build their own)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from digenrl.models import ModelBundle, build_model_bundle


@pytest.fixture(scope="session")
def bundles() -> Callable[[str], ModelBundle]:
    """`bundles(name)` builds a tiny bundle once per session."""
    cache: dict[str, ModelBundle] = {}

    def get(name: str) -> ModelBundle:
        if name not in cache:
            cache[name] = build_model_bundle(name)
        return cache[name]

    return get
