"""Fixtures of the evaluation tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def small_square_model():
    """The colour-square model (tests/square_model.py) at its images' own size for 32 x 24 images (shorter side 24, no
    normalisation): the randomisation metrics' and ARCC's light tests."""
    from square_model import CLASSES, build

    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.loading import LoadedModel

    spec = InputSpec(size=24, mean=(0, 0, 0), std=(1, 1, 1))
    return LoadedModel(build(), "colour-detector", "none", list(CLASSES), spec)
