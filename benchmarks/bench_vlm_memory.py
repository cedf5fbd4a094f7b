"""What an answer's map keeps for its backward pass (issue 32, point 6), against the same pass run as training runs
it (every parameter requiring a gradient), and an estimate for a real 7B model from a measured real-size layer.

* The tiny configurations of each family (tests/vlm_models.py), one 96x48 photo, the given answer "a red cat" with
  a map per token: bytes of the storages autograd saves (tests/saved_memory.py), the map's and the training-style
  pass's, and the ratio.
* ``--real``: LLaVA-1.5-7B's shapes (CLIP ViT-L/14 at 336 px: 576 image tokens; Llama-2-7B: hidden size 4096, MLP
  11008, 32 heads, vocabulary 32064) with random weights, built twice with 1 and with 2 decoder layers (and 2 vision
  layers: the tower keeps nothing either way), in ``--dtype`` (bfloat16 by default, as ``--precision bf16`` loads
  it): the difference is what one decoder layer keeps, measured, and the estimate for the full model is the
  1-layer figure plus 31 more layers, beside the weights of the full model (counted on the meta device). Takes
  about 4 GB of memory and a minute or two on a CPU.

Usage: ``python benchmarks/bench_vlm_memory.py [--real] [--dtype bfloat16|float32] [--families NAME,...]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import vlm_models  # noqa: E402
from saved_memory import KeptMemory, kept_training_style, layer_module  # noqa: E402
from vlm_models import answerer, load_vlm  # noqa: E402

from gradcam_cli.cam.explainer import Explainer  # noqa: E402
from gradcam_cli.cam.prompted import answer_gradients  # noqa: E402
from gradcam_cli.models.families.vision_language import LLAVA  # noqa: E402
from gradcam_cli.models.profile import LoadedModel, ModelProfile  # noqa: E402

PROMPT = "what is the cat ?"
ANSWER = "a red cat"
MB = 1e6


def kept(explainer: Explainer, image: Image.Image, answer: str, per_token: bool) -> tuple[int, int]:
    """Bytes kept by the map's pass and by the same forward pass with every parameter requiring a gradient."""
    score: Any = explainer.score
    inputs = score.inputs(image, PROMPT)
    ids = score.encode(answer)
    with KeptMemory(explainer.model.module, layer_module(explainer)) as ours:
        answer_gradients(explainer, inputs, ids, score.answer_targets(ids, per_token))
    full = kept_training_style(explainer, inputs, ids)
    return ours.total, full.total


def tiny(families: list[str]) -> None:
    image = Image.new("RGB", (96, 48), (220, 30, 30))
    image.paste((30, 30, 220), (48, 0, 96, 48))
    print("tiny configurations, answer 'a red cat' with a map per token: bytes kept for the backward pass")
    print(f"  {'family':<12} {'map':>10} {'training-style':>15} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as folder:
        for name in families:
            path = vlm_models.BUILDERS[name](Path(folder) / name)
            explainer = answerer(load_vlm(f"hf:{path}", torch.device("cpu")))
            ours, full = kept(explainer, image, ANSWER, per_token=True)
            print(f"  {name:<12} {ours / 1e3:8.1f} kB {full / 1e3:12.1f} kB {ours / full:7.3f}", flush=True)


def llava_7b(text_layers: int, dtype: torch.dtype, device: torch.device | None) -> Any:
    """LLaVA-1.5-7B's configuration with ``text_layers`` decoder layers and 2 vision layers; on ``device`` with
    random weights, or on the meta device (no memory) when ``device`` is None."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24 if device is None else 2,
        num_attention_heads=16,
        image_size=336,
        patch_size=14,
        projection_dim=768,
    )
    text = LlamaConfig(
        vocab_size=32064,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=text_layers,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=len(vlm_models.WORDS),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    with torch.device(device or "meta"):
        return LlavaForConditionalGeneration(config).to(dtype).eval()


def real(dtype: torch.dtype) -> None:
    from transformers import CLIPImageProcessor, LlavaProcessor

    from gradcam_cli.models.modes import settle_loaded

    weights = sum(p.numel() for p in llava_7b(32, dtype, None).parameters())
    size = torch.tensor([], dtype=dtype).element_size()
    template = vlm_models.TEMPLATE.replace("{{ image_text }}", "<image>")
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
        tokenizer=vlm_models.tokenizer(["<image>"]),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=template,
    )
    image = Image.new("RGB", (640, 480), (220, 30, 30))
    figures = []
    for layers in (1, 2):
        module = llava_7b(layers, dtype, torch.device("cpu"))
        settle_loaded(module, torch.device("cpu"))
        profile = ModelProfile(task="answer", processor=processor, layout=LLAVA)
        vlm = LoadedModel(module, f"llava-1.5-7b shapes, {layers} layers", "none", profile=profile)
        explainer = answerer(vlm)
        tokens = explainer.score.inputs(image, PROMPT)["input_ids"].shape[1]
        ours, _ = kept(explainer, image, ANSWER, per_token=False)
        figures.append(ours)
        print(f"  {layers} decoder layer(s), {tokens} prompt tokens: {ours / MB:8.1f} MB kept", flush=True)
        del module, vlm, explainer
    per_layer = figures[1] - figures[0]
    estimate = figures[0] + 31 * per_layer
    print(f"LLaVA-1.5-7B shapes in {dtype}: {per_layer / MB:.1f} MB kept per decoder layer (measured)")
    print(f"  estimate for 32 layers: {estimate / 1e9:.2f} GB kept + {weights * size / 1e9:.2f} GB of weights")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="also measure a decoder layer of LLaVA-1.5-7B's size")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--families", default=",".join(vlm_models.BUILDERS))
    args = parser.parse_args()
    from transformers.utils import logging

    logging.disable_progress_bar()
    tiny(args.families.split(","))
    if args.real:
        real(getattr(torch, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
