"""A vision-language model's side of an answer (docs/vlm.md): the photo and the prompt through the processor's chat
template, the greedy answer (``generate``, seeded) or a given one's tokens, the teacher-forced log-probability of an
answer, and where the explained layer's tokens lie on the photo. :class:`Prompter` is what the answer task's score
(:class:`~gradcam_cli.cam.tasks.answer.AnswerScore`) asks of the model; what is differentiated and how the maps are
made is the one :class:`~gradcam_cli.cam.explainer.Explainer`'s (:mod:`gradcam_cli.cam.prompted`).

An answer's score is the sum of its tokens' log-probabilities under teacher forcing: one forward pass of prompt +
answer, where token t's log-probability is read from the logits at the position before it. A per-token target is one
token's log-probability, ``answer:WORD`` the sum over the answer tokens that spell WORD,
``contrast:answer:A,answer:B`` log p(A) - log p(B) (two passes, since the answers differ; the image tokens are the
same in both). The explained layer's output is flattened to its tokens (L, C) and a method sees them as one
(1, C, 1, L) map, so a channel weight is pooled over all image tokens (every tile), and the per-token map is put back
on the photo through the family's geometry (:mod:`gradcam_cli.models.token_layouts`). A video clip
(:class:`SampledClip`) goes through the processor's video path instead, and its tokens are laid out time first from
the family's :data:`~gradcam_cli.models.token_layouts.VideoGrid` (docs/video.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from torch import nn

from ..errors import UsageError
from ..models.clip_spec import ClipSpec
from ..models.profile import LoadedModel
from ..models.tiles import Tile, place
from ..targets import TargetSpec
from .answer_model import placeholder_ids, stop_ids
from .maps import upsample
from .methods import METHODS

TEXT_KEYS = ("input_ids", "attention_mask", "rows", "cols")
"""What the processor returns besides what the model takes with the token ids."""
PER_TOKEN_KEYS = ("token_type_ids", "mm_token_type_ids")
"""The processor's per-token tensors besides the ids (Qwen2-VL's image-token marks): 0 for the answer's tokens."""
PROBE_PROMPT = "what is in the image?"
"""The prompt of the passes that find the layers' shapes and try a ``--layer`` (any prompt: the image's tokens do not
depend on it)."""
PROBE_SIDE = 224
"""The side of the grey photo those passes see when no image is given."""
VIDEO_FPS = 2.0
"""The rate a video is sampled at for a video processor that names none (``fps``): Qwen2-VL's reference
(qwen-vl-utils' ``FPS``)."""


def grey_photo() -> Image.Image:
    """The photo the probe passes see when no image is given: mid grey, :data:`PROBE_SIDE` square."""
    return Image.new("RGB", (PROBE_SIDE, PROBE_SIDE), (128,) * 3)


def answer_methods() -> tuple[str, ...]:
    """The methods that explain an answer: those that read the layer's activations and gradients alone (no
    :class:`~gradcam_cli.cam.methods.needs.Need`), plugins' included."""
    return tuple(name for name, method in METHODS.items() if method.needs is None and method.uses_layer)


@dataclass(frozen=True)
class AnswerToken:
    """One token of the answer: its text, its id and its teacher-forced log-probability."""

    text: str
    id: int
    logprob: float


@dataclass(frozen=True)
class AnswerTarget:
    """What one map explains: ``label`` (``answer``, ``token 2: cat``, ``answer:cat``, a contrast), and its terms:
    (answer token ids, which of their log-probabilities are summed, sign)."""

    label: str
    terms: tuple[tuple[tuple[int, ...], tuple[int, ...], float], ...]
    token: int | None = None


@dataclass
class AnswerMap:
    """One method's map of one target: the score explained, the coarse per-token values (L,) before placing and
    normalising, and the map on the photo, (H, W) in [0, 1] (a video clip's: (T, H, W) over its frames)."""

    target: AnswerTarget
    method: str
    score: float
    values: torch.Tensor
    saliency: torch.Tensor


@dataclass
class AnswerExplanation:
    """An answer and its maps: the prompt, the answer (generated or given), its tokens, the layer."""

    prompt: str
    answer: str
    generated: bool
    tokens: list[AnswerToken]
    layer: str
    maps: list[AnswerMap] = field(default_factory=list)

    @property
    def logprob(self) -> float:
        """The answer's log-probability: the sum of its tokens'."""
        return sum(token.logprob for token in self.tokens)


class _Prompted(nn.Module):
    """The model with the photo's tensors bound: called with token ids, it returns their logits."""

    def __init__(self, model: nn.Module, images: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.images = dict(images)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        extra = {
            key: torch.cat((value, value.new_zeros(1, input_ids.shape[1] - value.shape[1])), dim=1)
            if key in PER_TOKEN_KEYS
            else value
            for key, value in self.images.items()
        }
        output = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **extra)
        logits: torch.Tensor = output.logits
        return logits


@dataclass(frozen=True)
class SampledClip:
    """A video clip as a vision-language model is asked about it: ``frames`` (T, H, W, 3) uint8, sampled at
    ``offsets`` of its ``span`` video frames (:func:`~gradcam_cli.models.clip_spec.sample_offsets`) of a video of
    ``fps`` frames per second."""

    frames: torch.Tensor
    offsets: tuple[int, ...]
    span: int
    fps: float


@dataclass(frozen=True)
class Question:
    """What a run asks of every prompted image besides its prompt: ``answer`` to explain instead of the generated
    one, a map per answer token (``per_token``), and ``--target`` specs."""

    answer: str | None = None
    per_token: bool = False
    specs: tuple[TargetSpec, ...] = ()


class Prompter:
    """What an answer asks of a vision-language ``model``: its processor's tensors for a photo and a prompt, the
    greedy answer (at most ``max_new_tokens``, ``seed``) or a given one's tokens, the teacher-forced log-probability
    of an answer, and where a layer's tokens lie on the photo."""

    def __init__(self, model: LoadedModel, max_new_tokens: int = 32, seed: int = 0) -> None:
        if model.layout is None or model.processor is None:
            raise UsageError(f"{model.name} is no vision-language model: it has no token layout or processor")
        self.model, self.layout = model, model.layout
        self.max_new_tokens, self.seed = max_new_tokens, seed
        self.device = next(model.module.parameters()).device
        if getattr(model.processor, "chat_template", None) is None:
            raise UsageError(
                f"{model.name} has no chat template (chat_template.jinja or the processor's chat_template): "
                f"--prompt puts the question and the image through it; add the model's own"
            )

    @property
    def tokenizer(self) -> Any:
        """The processor's tokenizer."""
        return self.model.processor.tokenizer

    def check_text(self, option: str, text: str) -> None:
        """Refuse, in one line, a prompt or answer with the model's image placeholder token in it (``<image>``,
        ``<|image_pad|>``): the processor would take it for a place of the photo's features."""
        module: Any = self.model.module
        names = self.tokenizer.convert_ids_to_tokens(placeholder_ids(module.config))
        found = [name for name in names if isinstance(name, str) and name and name in text]
        if found:
            raise UsageError(
                f"{option} {text!r} contains {found[0]}, {self.model.name}'s image placeholder: the image is put in "
                f"by the chat template; leave it out"
            )

    def inputs(self, image: Image.Image, prompt: str) -> dict[str, torch.Tensor]:
        """The processor's tensors for the photo and the prompt in the chat template, on the model's device."""
        self.check_text("--prompt", prompt)
        processor = self.model.processor
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        encoded = processor(images=[image], text=[text], return_tensors="pt")
        dtype = next(self.model.module.parameters()).dtype
        return {
            key: value.to(self.device, dtype if value.is_floating_point() else value.dtype)
            for key, value in encoded.items()
            if isinstance(value, torch.Tensor)
        }

    def generate(self, inputs: Mapping[str, torch.Tensor]) -> list[int]:
        """The greedy answer's token ids (seeded; without the end-of-sequence and padding tokens; never an image
        placeholder, which the model would take for a place of image features when the answer is fed back)."""
        torch.manual_seed(self.seed)
        module: Any = self.model.module
        with torch.no_grad():
            output = module.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                suppress_tokens=placeholder_ids(module.config),
            )
        new = output[0, inputs["input_ids"].shape[1] :].tolist()
        stops = stop_ids(module, self.tokenizer)
        while new and new[-1] in stops:
            new.pop()
        return [int(token) for token in new]

    def encode(self, answer: str) -> list[int]:
        """A given answer's token ids (no special tokens)."""
        ids: list[int] = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        if not ids:
            raise UsageError(f"--answer {answer!r} has no tokens")
        return ids

    def prompted(self, inputs: Mapping[str, torch.Tensor]) -> nn.Module:
        """The model with the photo's tensors of ``inputs`` bound: called with prompt + answer ids, their logits."""
        return _Prompted(self.model.module, {key: value for key, value in inputs.items() if key not in TEXT_KEYS})

    def tiles(self, inputs: Mapping[str, torch.Tensor], image: Image.Image, tokens: int) -> list[Tile]:
        """Where the layer's ``tokens`` lie on the photo, in row-major order (the family's geometry)."""
        config: Any = self.model.module.config
        return self.layout.tiles(self.model.processor, config, inputs, (image.height, image.width), tokens)

    def place(
        self, values: torch.Tensor, inputs: Mapping[str, torch.Tensor], image: Image.Image, layer: str
    ) -> torch.Tensor:
        """``layer``'s per-token ``values`` (L,), in the layer's order, on the photo: (H, W), not normalised."""
        order = self.layout.order
        if order is not None:
            row_major = torch.empty_like(values)
            row_major[order(self.model.module.config, inputs).to(values.device)] = values
            values = row_major
        tiles = self.tiles(inputs, image, values.shape[0])
        if max(tile.end for tile in tiles) != values.shape[0]:
            raise UsageError(
                f"--layer {layer} outputs {values.shape[0]} tokens, not the {max(tile.end for tile in tiles)} "
                f"of the image's token grid ({self.layout.name}); choose a layer with that layout, such as "
                f"{self.layout.default_layer}"
            )
        return place(values, tiles, (image.height, image.width))

    # --- a video (docs/video.md, "A vision-language model's answer") ---------------------------------------------

    def video_refusal(self) -> str | None:
        """Why the model answers no video, in one line (its family has no video path, its processor no video
        processor); ``None`` where it does."""
        if self.layout.video is None:
            return (
                f"{self.model.name} is a {self.layout.name} vision-language model: its processor takes images only "
                f"(no video path), so it answers no question about a video; ask it about the video's frames as images"
            )
        if getattr(self.model.processor, "video_processor", None) is None:
            return (
                f"{self.model.name} has no video processor (video_preprocessor_config.json): it answers no question "
                f"about a video; save the model's processor there with processor.save_pretrained(FOLDER)"
            )
        return None

    def video_frames(self, frames: int, fps: float) -> int:
        """How many frames the model sees of a video of ``frames`` frames at ``fps``, asked about as one clip: the
        whole video sampled at the video processor's rate (``fps``, else :data:`VIDEO_FPS`), a multiple of its
        ``temporal_patch_size`` frames (at least one patch, at most its ``max_frames``); which frames:
        :func:`~gradcam_cli.models.clip_spec.sample_offsets`."""
        video = self.model.processor.video_processor
        rate = float(getattr(video, "fps", None) or VIDEO_FPS)
        patch = int(getattr(video, "temporal_patch_size", None) or 1)
        most = max(patch, int(getattr(video, "max_frames", None) or frames) // patch * patch)
        step = ClipSpec(1, rate).step(fps)
        wanted = math.ceil(max(1, round(frames / step)) / patch) * patch
        return min(most, wanted)

    def video_inputs(self, clip: SampledClip, prompt: str) -> dict[str, torch.Tensor]:
        """The processor's tensors for the ``clip``'s sampled frames and the prompt in the chat template (a
        ``video`` part in place of the image), on the model's device; the processor samples no frames again, and
        is told which frames of the clip at which rate they are (its ``video_metadata``: Qwen2.5-VL's time
        positions)."""
        from transformers.video_utils import VideoMetadata

        self.check_text("--prompt", prompt)
        processor = self.model.processor
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        options: dict[str, Any] = {"do_sample_frames": False}
        if hasattr(processor.video_processor, "cap_pixels_per_frame"):
            options["cap_pixels_per_frame"] = True  # the reference's per-frame pixel budget
        height, width = (int(side) for side in clip.frames.shape[1:3])
        metadata = VideoMetadata(clip.span, clip.fps, width, height, frames_indices=list(clip.offsets))
        frames = clip.frames.cpu().numpy()
        encoded = processor(videos=[frames], video_metadata=[metadata], text=[text], return_tensors="pt", **options)
        dtype = next(self.model.module.parameters()).dtype
        return {
            key: value.to(self.device, dtype if value.is_floating_point() else value.dtype)
            for key, value in encoded.items()
            if isinstance(value, torch.Tensor)
        }

    def video_grid(self, values: torch.Tensor, inputs: Mapping[str, torch.Tensor], layer: str) -> torch.Tensor:
        """``layer``'s per-token ``values`` (L,) of a video, in the layer's order, as the (t, h, w) grid of its
        tokens (time first, :data:`~gradcam_cli.models.token_layouts.VideoGrid`)."""
        config = self.model.module.config
        assert self.layout.video is not None
        if self.layout.order is not None:
            row_major = torch.empty_like(values)
            row_major[self.layout.order(config, inputs).to(values.device)] = values
            values = row_major
        grid = self.layout.video(config, inputs)
        if math.prod(grid) != values.shape[0]:
            raise UsageError(
                f"--layer {layer} outputs {values.shape[0]} tokens, not the {math.prod(grid)} of the video's token "
                f"grid ({self.layout.name}); choose a layer with that layout, such as {self.layout.default_layer}"
            )
        return values.reshape(grid)

    def place_video(
        self, values: torch.Tensor, inputs: Mapping[str, torch.Tensor], span: int, layer: str
    ) -> torch.Tensor:
        """``layer``'s per-token ``values`` of a video on its ``span`` video frames at the processor's pixels:
        (span, H, W), resized trilinearly from the (t, h, w) grid (linearly in time: each temporal patch centred on
        its sampled frames), not normalised."""
        grid = self.video_grid(values, inputs, layer)
        module: Any = self.model.module
        vision = module.config.vision_config
        merge = int(getattr(vision, "spatial_merge_size", 1))
        patch = int(getattr(vision, "patch_size", 1))
        size = (span, grid.shape[1] * merge * patch, grid.shape[2] * merge * patch)
        return upsample(grid[None].float(), size)[0]

    def answer_logprob(self, image: Image.Image, prompt: str, answer: Sequence[int]) -> float:
        """The answer's teacher-forced log-probability for ``image`` (no gradient, no hook)."""
        inputs = self.inputs(image, prompt)
        prompt_ids = inputs["input_ids"]
        ids = torch.cat((prompt_ids, torch.tensor([list(answer)], device=prompt_ids.device)), dim=1)
        start = prompt_ids.shape[1]
        with torch.no_grad():
            logits = self.prompted(inputs)(ids)
        chosen = logits[0, start - 1 : start - 1 + len(answer)].float().log_softmax(dim=-1)
        return float(chosen.gather(1, ids[0, start:, None]).sum())
