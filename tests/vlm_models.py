"""Tiny random vision-language models of each supported family, saved with a processor whose tokenizer and chat
template are made here (no download): LLaVA-1.5 and NeXT, Qwen2-VL, Qwen2.5-VL, Idefics3, and a LLaVA trained briefly to
answer from one region of the photo."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "USER:", "ASSISTANT:", "a", "cat", "dog", "red", "blue", "is", "what"]
WORDS += ["the", "?", "left", "right", "green", "sits", "on", "mat", "big", "small", "two"]
TEMPLATE = (
    "{% for m in messages %}{{ m['role'].upper() }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "{{ image_text }} {% elif c['type'] == 'video' %}{{ video_text }} {% else %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


def load_vlm(model: str, device: torch.device, precision: str = "fp32"):
    """``hf:DIR`` loaded for the ``answer`` task (its profile carries the processor and the token layout), settled on
    ``device`` as the command loads it."""
    from gradcam_cli.models.loading import load_model
    from gradcam_cli.models.modes import settle_loaded
    from gradcam_cli.options import ModelOptions

    loaded = load_model(ModelOptions(model, precision=precision, task="answer"))
    settle_loaded(loaded.module, device)
    return loaded


def answerer(vlm, layer: str | None = None, methods=("gradcam",), max_new_tokens: int = 32):
    """The one :class:`~gradcam_cli.cam.explainer.Explainer` of a loaded vision-language model (its score the answer
    task's), as a library user builds it."""
    from gradcam_cli.cam.explainer import Explainer
    from gradcam_cli.options import AnswerOptions, ExplainOptions

    layers = (layer,) if layer is not None else ()
    question = AnswerOptions(max_new_tokens=max_new_tokens)
    return Explainer(vlm, ExplainOptions(layers=layers, methods=tuple(methods), question=question))


def tokenizer(special: list[str]):
    """A word-level tokenizer over :data:`WORDS` and the family's ``special`` image tokens (split out of runs)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate([*WORDS, *special])}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    inner.add_special_tokens(special)
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


TINY_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
"""The CLIP-like vision towers' configuration (LLaVA's, Idefics3's): 32 px images of 8 px patches, 2 heads 16 wide."""


def _llama(vocab: int):
    """A tiny Llama for the language model, padding 0, start 2, end 3 (the tokenizer's)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )


def text_model(folder: Path) -> Path:
    """A tiny text-only Llama (the language model of :func:`llava` alone, no vision tower): a model that answers no
    question about a photo."""
    from transformers import LlamaForCausalLM

    LlamaForCausalLM(_llama(32)).save_pretrained(folder)
    return folder


def _save(model, processor, folder: Path) -> Path:
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 3
    model.generation_config.bos_token_id = 2
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]
"""The tiny LLaVA-NeXT's resolutions (height, width) of 32 px tiles."""


def llava(folder: Path, vision_layers: int = 2, seed: int = 0, version: str = "1.5") -> Path:
    """LLaVA-1.5: CLIP vision tower (32 px, 8 px patches), projector, Llama; shortest edge 32, centre crop 32.
    ``version`` "next": LLaVA-NeXT, 32 px tiles of the best of :data:`PINPOINTS` after the whole photo.
    ``vision_layers=0``: one layer whose attention output is zero (LLaVA reads a layer's hidden states), so that
    each image token depends on its own patch only."""
    import transformers
    from transformers import CLIPVisionConfig

    torch.manual_seed(seed)
    vision = CLIPVisionConfig(**TINY_VISION, num_hidden_layers=max(vision_layers, 1))
    prefix = "LlavaNext" if version == "next" else "Llava"
    extra = {"image_grid_pinpoints": PINPOINTS} if version == "next" else {}
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=vision,
        text_config=_llama(len(WORDS) + 1),
        image_token_index=len(WORDS),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        **extra,
    )
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config).eval()
    if vision_layers == 0:
        with torch.no_grad():
            for layer in model.model.vision_tower.encoder.layers:
                layer.self_attn.out_proj.weight.zero_()
                layer.self_attn.out_proj.bias.zero_()
    sizes = {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}
    if version == "next":
        images = transformers.LlavaNextImageProcessor(**sizes, image_grid_pinpoints=PINPOINTS)
    else:
        images = transformers.CLIPImageProcessor(**sizes)
    template = TEMPLATE.replace("{{ image_text }}", "<image>")
    processor = getattr(transformers, f"{prefix}Processor")(
        image_processor=images,
        tokenizer=tokenizer(["<image>"]),
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=template,
    )
    return _save(model, processor, folder)


def llava_next(folder: Path, vision_layers: int = 2, seed: int = 0) -> Path:
    """LLaVA-NeXT (:func:`llava`)."""
    return llava(folder, vision_layers, seed, version="next")


QWEN_SPECIAL = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]


def qwen2_vl(folder: Path, vision_layers: int = 1, seed: int = 0, version: str = "2") -> Path:
    """Qwen2-VL (``version`` "2.5": Qwen2.5-VL, with 56 px windows of 2 x 2 merged tokens): 14 px patches merged
    2 x 2, images resized whole to multiples of 28 between 28x28 and 112x112."""
    import transformers
    from transformers import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    torch.manual_seed(seed)
    first = len(WORDS)
    vision = {
        "depth": vision_layers,
        "hidden_size": 16,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    if version == "2.5":
        vision.update(out_hidden_size=32, intermediate_size=32, window_size=56, fullatt_block_indexes=[])
        prefix = "Qwen2_5_VL"
    else:
        vision.update(embed_dim=16, hidden_size=32, mlp_ratio=2)
        prefix = "Qwen2VL"
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=vision,
        text_config={
            "vocab_size": first + len(QWEN_SPECIAL),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0},
            "pad_token_id": 0,
            "bos_token_id": 2,
            "eos_token_id": 3,
        },
        vision_start_token_id=first,
        image_token_id=first + 1,
        vision_end_token_id=first + 2,
        video_token_id=first + 3,
    )
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config).eval()
    images = Qwen2VLImageProcessor(
        min_pixels=28 * 28, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    template = TEMPLATE.replace("{{ image_text }}", "<|vision_start|><|image_pad|><|vision_end|>")
    template = template.replace("{{ video_text }}", "<|vision_start|><|video_pad|><|vision_end|>")
    processor = getattr(transformers, f"{prefix}Processor")(
        image_processor=images,
        tokenizer=tokenizer(QWEN_SPECIAL),
        video_processor=Qwen2VLVideoProcessor(size={"shortest_edge": 28 * 28, "longest_edge": 84 * 112}),
        chat_template=template,
    )
    return _save(model, processor, folder)


def qwen2_5_vl(folder: Path, vision_layers: int = 1, seed: int = 0) -> Path:
    """Qwen2.5-VL (:func:`qwen2_vl`)."""
    return qwen2_vl(folder, vision_layers, seed, version="2.5")


IDEFICS_SPECIAL = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
IDEFICS_SPECIAL += [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]


def idefics3(folder: Path, vision_layers: int = 1, seed: int = 0) -> Path:
    """Idefics3: 32 px tiles of 8 px patches, pixel-shuffled 2 x 2 (4 tokens a tile); photos resized to a longest
    edge of 64 and split into up to 2 x 2 tiles, then the global image."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
    )

    torch.manual_seed(seed)
    first = len(WORDS)
    vision = Idefics3VisionConfig(**TINY_VISION, num_hidden_layers=vision_layers)
    text = _llama(first + len(IDEFICS_SPECIAL))
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, image_token_id=first + 1)
    model = Idefics3ForConditionalGeneration(config).eval()
    images = Idefics3ImageProcessor(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True
    )
    template = TEMPLATE.replace("{{ image_text }}", "<image>")
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tokenizer(IDEFICS_SPECIAL), image_seq_len=4, chat_template=template
    )
    return _save(model, processor, folder)


COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
KNOWN_PROMPT = "what is the left ?"


def known_answer_photo(rng, answer: str) -> Image.Image:
    """A 32 x 32 photo of 8 px squares of random colours whose top-left 16 x 16 quarter is ``answer``'s colour."""
    image = Image.new("RGB", (32, 32))
    for row in range(4):
        for col in range(4):
            image.paste(Image.new("RGB", (8, 8), COLOURS[rng.choice(list(COLOURS))]), (col * 8, row * 8))
    image.paste(Image.new("RGB", (16, 16), COLOURS[answer]), (0, 0))
    return image


def trained_llava(folder: Path, steps: int = 150) -> Path:
    """:func:`llava` trained briefly (a few seconds) to answer the colour of the photo's top-left quarter, red or
    blue, whatever the other squares show: its answer depends on that region alone."""
    import random

    from transformers import AutoProcessor, LlavaForConditionalGeneration

    llava(folder)
    processor = AutoProcessor.from_pretrained(folder)
    model = LlavaForConditionalGeneration.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": KNOWN_PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    ids = {word: processor.tokenizer.convert_tokens_to_ids(word) for word in ("red", "blue")}
    rng = random.Random(0)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        answers = [rng.choice(["red", "blue"]) for _ in range(16)]
        photos = [known_answer_photo(rng, answer) for answer in answers]
        inputs = processor(images=photos, text=[text] * len(photos), return_tensors="pt")
        logits = model(**inputs).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([ids[answer] for answer in answers]))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    model.save_pretrained(folder)
    return folder


BUILDERS = {
    "llava": llava,
    "llava-next": llava_next,
    "qwen2-vl": qwen2_vl,
    "qwen2.5-vl": qwen2_5_vl,
    "idefics3": idefics3,
}
"""Each supported family's tiny random model, by name (``builder(folder)`` saves it there and returns the folder)."""
