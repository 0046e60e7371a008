"""Fixtures for the paper-figure tests: the committed sample inputs and a PNG checker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from .checks import DATA_DIR

SAMPLE_RUN = DATA_DIR / "tiny_cpu2_run"
SAMPLE_TABLE = DATA_DIR / "results_table.json"


def assert_png(path: Path, size: tuple[int, int] | None = None) -> tuple[int, int]:
    """The file exists, PIL decodes it fully as a PNG, and (if given) it is ``size`` pixels."""
    assert path.is_file(), f"{path} was not written"
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()  # decodes every chunk: a truncated/corrupt file fails here
        actual = image.size
    if size is not None:
        assert actual == size
    return actual


@pytest.fixture
def png_ok() -> Callable[..., tuple[int, int]]:
    return assert_png


@pytest.fixture
def sample_run() -> Path:
    return SAMPLE_RUN


@pytest.fixture
def sample_table() -> Path:
    return SAMPLE_TABLE


@pytest.fixture
def data_dir() -> Path:
    return DATA_DIR
