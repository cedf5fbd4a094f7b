"""Maps of a vision-language model's answer: what is differentiated, and how (docs/vlm.md).

The prompt goes through the processor's chat template with the photo; the answer is the greedy continuation
(``generate``, seeded) or one given. Its score is the sum of the answer tokens' log-probabilities under teacher
forcing: one forward pass of prompt + answer, where token t's log-probability is read from the logits at the
position before it. A per-token target is one token's log-probability, ``answer:WORD`` the sum over the answer
tokens that spell WORD, ``contrast:answer:A,answer:B`` log p(A) - log p(B) (two passes, since the answers differ;
the image tokens are the same in both).

The passes go through :class:`~gradcam_cli.cam.engine.LayerCapture`: the explained layer's output is a fresh leaf,
so the backward pass runs from the score to that layer and stops there, with no parameter gradient. The layer's
output is flattened to its tokens (L, C) and a method sees them as one (1, C, 1, L) map, so a channel weight is
pooled over all image tokens (every tile), and the per-token map is put back on the photo through the family's
geometry (:mod:`gradcam_cli.models.token_layouts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from torch import nn

from ..errors import UsageError, suggest
from ..models.profile import LoadedModel
from ..models.tiles import Tile, place
from ..targets import TargetSpec
from .answer_model import language_modules, placeholder_ids, stop_ids
from .engine import LayerCapture
from .layers import resolve_layer
from .maps import normalise
from .methods import METHODS, resolve_methods

TEXT_KEYS = ("input_ids", "attention_mask", "rows", "cols")
"""What the processor returns besides what the model takes with the token ids."""
PER_TOKEN_KEYS = ("token_type_ids", "mm_token_type_ids")
"""The processor's per-token tensors besides the ids (Qwen2-VL's image-token marks): 0 for the answer's tokens."""


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
    normalising, and the map on the photo, (H, W) in [0, 1]."""

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
class Question:
    """What a run asks of every prompted image besides its prompt: ``answer`` to explain instead of the generated
    one, a map per answer token (``per_token``), and ``--target`` specs."""

    answer: str | None = None
    per_token: bool = False
    specs: tuple[TargetSpec, ...] = ()


class AnswerExplainer:
    """Generates or takes an answer about a photo and explains it at ``layer`` (default: the family's) with
    ``methods``; ``question``: what a run asks of each image (:class:`Question`)."""

    def __init__(
        self,
        model: LoadedModel,
        layer: str | None = None,
        methods: Sequence[str] = ("gradcam",),
        max_new_tokens: int = 32,
        seed: int = 0,
        eigen_smooth: bool = False,
        question: Question | None = None,
        precision: str = "fp32",
    ) -> None:
        if model.layout is None or model.processor is None:
            raise UsageError(f"{model.name} is no vision-language model: it has no token layout or processor")
        self.model, self.layout = model, model.layout
        self.max_new_tokens, self.seed, self.eigen_smooth = max_new_tokens, seed, eigen_smooth
        self.question, self.precision = question or Question(), precision
        self.layer = layer or self.layout.default_layer
        self.module = resolve_layer(model.module, self.layer)  # as an image's layer: close matches on a typo
        if id(self.module) in language_modules(model.module):
            raise UsageError(
                f"--layer {self.layer} is part of the language model: its tokens are the prompt's and the answer's, "
                f"not the photo's; choose a layer of the vision tower or the projector, such as "
                f"{self.layout.default_layer}"
            )
        usable = answer_methods()
        for method in methods:
            if method in METHODS and method not in usable:
                raise UsageError(f"--method {method} does not explain an answer; use one of {', '.join(usable)}")
        self.methods = tuple(resolve_methods(list(methods), "answer", also=usable))  # names, ``all``: the registry's
        self.device = next(model.module.parameters()).device
        if getattr(model.processor, "chat_template", None) is None:
            raise UsageError(
                f"{model.name} has no chat template (chat_template.jinja or the processor's chat_template): "
                f"--prompt puts the question and the image through it; add the model's own"
            )
        if self.question.answer is not None:
            self.check_text("--answer", self.question.answer)

    @property
    def tokenizer(self) -> Any:
        """The processor's tokenizer."""
        return self.model.processor.tokenizer

    @property
    def settings(self) -> dict[str, object]:
        """What the answer task adds to a run record and to every row's provenance."""
        return {
            "task": "answer",
            "max_new_tokens": self.max_new_tokens,
            "per_token": self.question.per_token,
            "targets": [str(spec) for spec in self.question.specs] or None,
        }

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

    def targets(self, answer: Sequence[int], per_token: bool, specs: Sequence[TargetSpec] = ()) -> list[AnswerTarget]:
        """The answer as a whole (without ``specs``), each of its tokens with ``per_token``, and each spec."""
        whole = tuple(range(len(answer)))
        targets = [] if specs else [AnswerTarget("answer", ((tuple(answer), whole, 1.0),))]
        if per_token:
            decode = self.tokenizer.decode
            targets += [
                AnswerTarget(f"token {i}: {decode([token]).strip()}", ((tuple(answer), (i,), 1.0),), token=i)
                for i, token in enumerate(answer)
            ]
        targets += [self._spec_target(spec, answer) for spec in specs]
        return targets

    def _spec_target(self, spec: TargetSpec, answer: Sequence[int]) -> AnswerTarget:
        if spec.kind == "contrast" and all(part.kind == "answer" for part in spec.parts):
            first, second = (self.encode(part.value) for part in spec.parts)
            return AnswerTarget(
                f"{spec.parts[0].value} - {spec.parts[1].value}",
                (
                    (tuple(first), tuple(range(len(first))), 1.0),
                    (tuple(second), tuple(range(len(second))), -1.0),
                ),
            )
        if spec.kind == "answer":
            return AnswerTarget(str(spec), ((tuple(answer), self._word_tokens(spec.value, answer), 1.0),))
        raise UsageError(f"--target {spec}: a vision-language answer takes answer:WORD or contrast:answer:A,answer:B")

    def _word_tokens(self, word: str, answer: Sequence[int]) -> tuple[int, ...]:
        """The answer tokens that spell ``word`` (its first occurrence, any case), found by decoding runs."""
        decode = self.tokenizer.decode
        wanted = word.strip().lower()
        for start in range(len(answer)):
            for end in range(start + 1, len(answer) + 1):
                text = decode(list(answer[start:end])).strip().lower()
                if text == wanted:
                    return tuple(range(start, end))
                if len(text) > len(wanted):
                    break
        words = [decode([token]).strip() for token in answer]
        raise UsageError(f"answer:{word}: not a word of the answer ({' '.join(words)}){suggest(wanted, words)}")

    def explain(
        self,
        image: Image.Image,
        prompt: str,
        answer: str | None = None,
        per_token: bool = False,
        specs: Sequence[TargetSpec] = (),
    ) -> AnswerExplanation:
        """Answer (or take ``answer``), then map the answer, its tokens with ``per_token``, and ``specs``."""
        inputs = self.inputs(image, prompt)
        ids = self.generate(inputs) if answer is None else self.encode(answer)
        if not ids:  # the model ended at once: an empty answer, nothing to map
            return AnswerExplanation(prompt, "", True, [], self.layer)
        return self.explain_ids(image, prompt, ids, answer is None, self.targets(ids, per_token, specs), inputs)

    def explain_ids(
        self,
        image: Image.Image,
        prompt: str,
        ids: Sequence[int],
        generated: bool,
        targets: Sequence[AnswerTarget],
        inputs: Mapping[str, torch.Tensor] | None = None,
    ) -> AnswerExplanation:
        """Map ``targets`` of the answer ``ids`` (generated or given before: nothing is generated here)."""
        inputs = self.inputs(image, prompt) if inputs is None else inputs
        ids = [int(token) for token in ids]
        activations, gradients, logprobs = self.gradients(inputs, ids, targets)
        decode = self.tokenizer.decode
        tokens = [AnswerToken(decode([t]), t, float(lp)) for t, lp in zip(ids, logprobs, strict=True)]
        text = decode(ids, skip_special_tokens=True).strip() or decode(ids).strip()  # special alone: shown
        result = AnswerExplanation(prompt, text, generated, tokens, self.layer)
        for target, (score, gradient) in zip(targets, gradients, strict=True):
            for method in self.methods:
                values = self.token_map(method, activations, gradient)
                placed = self.place(values, inputs, image)
                result.maps.append(AnswerMap(target, method, score, values, normalise(placed[None])[0]))
        return result

    def tiles(self, inputs: Mapping[str, torch.Tensor], image: Image.Image, tokens: int) -> list[Tile]:
        """Where the layer's ``tokens`` lie on the photo, in row-major order (the family's geometry)."""
        config: Any = self.model.module.config
        return self.layout.tiles(self.model.processor, config, inputs, (image.height, image.width), tokens)

    def place(self, values: torch.Tensor, inputs: Mapping[str, torch.Tensor], image: Image.Image) -> torch.Tensor:
        """The layer's per-token ``values`` (L,), in the layer's order, on the photo: (H, W), not normalised."""
        order = self.layout.order
        if order is not None:
            row_major = torch.empty_like(values)
            row_major[order(self.model.module.config, inputs).to(values.device)] = values
            values = row_major
        tiles = self.tiles(inputs, image, values.shape[0])
        if max(tile.end for tile in tiles) != values.shape[0]:
            raise UsageError(
                f"--layer {self.layer} outputs {values.shape[0]} tokens, not the {max(tile.end for tile in tiles)} "
                f"of the image's token grid ({self.layout.name}); choose a layer with that layout, such as "
                f"{self.layout.default_layer}"
            )
        return place(values, tiles, (image.height, image.width))

    def token_map(self, method: str, activations: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        """``method``'s map of the layer's tokens, (L,): the (L, C) tokens seen as one (1, C, 1, L) map."""
        spatial = activations.T.reshape(1, -1, 1, activations.shape[0])
        grads = gradient.T.reshape(1, -1, 1, gradient.shape[0])
        coarse: torch.Tensor = METHODS[method].compute(spatial, grads, eigen_smooth=self.eigen_smooth)
        return coarse.reshape(-1)

    def answer_logprob(self, image: Image.Image, prompt: str, answer: Sequence[int]) -> float:
        """The answer's teacher-forced log-probability for ``image`` (no gradient, no hook)."""
        inputs = self.inputs(image, prompt)
        images = {key: value for key, value in inputs.items() if key not in TEXT_KEYS}
        prompt_ids = inputs["input_ids"]
        ids = torch.cat((prompt_ids, torch.tensor([list(answer)], device=prompt_ids.device)), dim=1)
        start = prompt_ids.shape[1]
        with torch.no_grad():
            logits = _Prompted(self.model.module, images)(ids)
        chosen = logits[0, start - 1 : start - 1 + len(answer)].float().log_softmax(dim=-1)
        return float(chosen.gather(1, ids[0, start:, None]).sum())

    def gradients(
        self, inputs: Mapping[str, torch.Tensor], answer: Sequence[int], targets: Sequence[AnswerTarget]
    ) -> tuple[torch.Tensor, list[tuple[float, torch.Tensor]], list[float]]:
        """The layer's tokens (L, C) in float32, each target's (score, gradient (L, C)), and the answer tokens'
        log-probabilities: one teacher-forced pass per distinct answer, one backward pass per target term."""
        images = {key: value for key, value in inputs.items() if key not in TEXT_KEYS}
        prompt = inputs["input_ids"]
        sequences = {terms[0] for target in targets for terms in target.terms} | {tuple(answer)}
        scores = [0.0 for _ in targets]
        grads: list[torch.Tensor | None] = [None for _ in targets]
        activations: torch.Tensor | None = None
        logprobs: list[float] = []
        for sequence in sorted(sequences, key=lambda s: s != tuple(answer)):
            with LayerCapture(_Prompted(self.model.module, images), {self.layer: self.module}) as capture:
                ids = torch.cat((prompt, torch.tensor([sequence], device=prompt.device)), dim=1)
                logits = capture.forward(ids)
                start = prompt.shape[1]
                chosen = logits[0, start - 1 : start - 1 + len(sequence)].float().log_softmax(dim=-1)
                token_logprobs = chosen.gather(1, ids[0, start:, None])[:, 0]
                if not token_logprobs.requires_grad:
                    raise self._unreached()
                if sequence == tuple(answer):
                    logprobs = token_logprobs.tolist()
                    activations = capture.activations()[self.layer].float().flatten(0, -2)
                for i, target in enumerate(targets):
                    for terms, which, sign in target.terms:
                        if terms != sequence:
                            continue
                        score = token_logprobs[list(which)].sum() * sign
                        gradient = capture.gradients(score, retain_graph=True)[self.layer].float().flatten(0, -2)
                        scores[i] += float(score.detach())
                        previous = grads[i]
                        grads[i] = gradient if previous is None else previous + gradient
        assert activations is not None
        if all(grad is None or not grad.any() for grad in grads):
            raise self._unreached()
        zeros = torch.zeros_like(activations)
        pairs = [(score, zeros if grad is None else grad) for score, grad in zip(scores, grads, strict=True)]
        return activations, pairs, logprobs

    def _unreached(self) -> UsageError:
        return UsageError(
            f"the answer does not depend on --layer {self.layer}'s output (the model does not read it, or reads it "
            f"another way); choose another, such as {self.layout.default_layer}"
        )
