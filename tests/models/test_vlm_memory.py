"""What an answer's map keeps in memory (issue 32, point 6): the backward pass runs from the answer's
log-probability to the explained layer and no further. Nothing computed below the layer (the vision tower) is saved
for it, no parameter gets a gradient, the model's flags are as found, and the graph kept is smaller than a plain
training-style pass's. Tiny random models of each family (tests/vlm_models.py); the bytes per family are
benchmarks/bench_vlm_memory.py's (docs/vlm.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
import vlm_models
from PIL import Image
from saved_memory import KeptMemory, kept_training_style, layer_module
from vlm_models import answerer, load_vlm

from gradcam_cli.cam.prompted import answer_gradients

PROMPT = "what is the cat ?"


@pytest.fixture(scope="module", params=list(vlm_models.BUILDERS))
def explainer(request, tmp_path_factory):
    folder = vlm_models.BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    return answerer(load_vlm(f"hf:{folder}", torch.device("cpu")), max_new_tokens=4)


def test_nothing_below_the_layer_is_kept_and_no_parameter_gets_a_gradient(explainer):
    image = Image.new("RGB", (96, 48), (200, 40, 40))
    inputs = explainer.score.inputs(image, PROMPT)
    answer = explainer.score.encode("a red cat")
    targets = explainer.score.answer_targets(answer, per_token=True)
    flags = [p.requires_grad for p in explainer.model.module.parameters()]
    with KeptMemory(explainer.model.module, layer_module(explainer)) as kept:
        _, gradients, _ = answer_gradients(explainer, inputs, answer, targets)
    assert kept.reached and kept.total > 0
    assert kept.below == 0, f"{kept.below} bytes saved below {explainer.layer_label}"
    assert all(gradient.any() for _, gradient in gradients[:1])
    assert all(p.grad is None for p in explainer.model.module.parameters())
    assert [p.requires_grad for p in explainer.model.module.parameters()] == flags

    # The same forward pass as training would run it keeps more, some of it below the layer.
    full = kept_training_style(explainer, inputs, answer)
    assert full.below > 0
    assert kept.total < full.total
