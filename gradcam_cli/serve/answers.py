"""A vision-language model in the explorer (docs/serve.md): asked a question about an image, it answers as
``gradcam IMAGE --prompt TEXT`` does (greedy, seeded, ``--max-new-tokens``; or explains the answer typed, as
``--answer``), and shows the whole answer's map, then a clicked word's: the map ``--target answer:WORD`` (or
``--per-token``) writes, computed by the same :class:`~gradcam_cli.cam.explainer.Explainer`
(:mod:`gradcam_cli.cam.prompted`). The answer is kept (:data:`KEPT_ANSWERS`), so a word's click, or another layer
or method, maps it without generating it again.

Routes (besides the explorer's, :mod:`gradcam_cli.serve.app`): ``POST /api/ask`` with a JSON body ``{"image",
"prompt", "answer" (optional), "layer", "method"}``: the answer, its tokens and words, and the whole answer's map;
``GET /api/answers/<id>/map?word=K&layer=&method=``: word K's map (no ``word``: the whole answer's). The maps are
then served as every map is (``/api/maps/<id>.png`` and its downloads; ``.../faithfulness`` for the whole answer's,
as ``gradcam eval --prompt`` measures it).
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..cam.results import Explanation, Prediction
from ..cam.tasks.answer import answer_score
from ..errors import UsageError, suggest
from ..io.naming import answer_name
from ..options import ExplainOptions, ModelOptions
from .http import HttpError, blocking, guarded, int_param, json_response, read_body, text_param
from .images import DecodedImage, ImageStore, Source
from .maps import MapStore, StoredMap, map_id
from .model import MAX_EXPLAINERS, MapAnswer, ModelThread

if TYPE_CHECKING:
    from ..cam.answer_words import AnswerWord
    from ..cam.answers import AnswerToken
    from ..cam.explainer import Explainer

KEPT_ANSWERS = 32
"""Answers kept (an older one's words are asked again)."""
MAX_QUESTION = 2000
"""The longest question (or given answer) taken, in characters."""
MAX_BODY = 64 * 1024
KEPT_SOURCES = 4096
"""Maps whose answer is remembered (for their faithfulness)."""


@dataclass
class Asked:
    """An answer kept: the image and question it answers, its token ids (generated, or ``--answer``'s), its text,
    tokens (with their log-probabilities) and words."""

    id: str
    image: str
    stem: str
    prompt: str
    ids: list[int]
    generated: bool
    text: str
    tokens: list[AnswerToken]
    words: list[AnswerWord]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "image": self.image,
            "prompt": self.prompt,
            "answer": self.text,
            "generated": self.generated,
            "logprob": sum(token.logprob for token in self.tokens),
            "tokens": [{"text": t.text, "id": t.id, "logprob": t.logprob} for t in self.tokens],
            "words": [{"text": word.text, "tokens": list(word.tokens)} for word in self.words],
        }


class AnswerService(ModelThread):
    """A vision-language model loaded once (by the family registry, as ``--prompt`` loads it), answering on
    request; ``options``: the command's layer, method (the first of a list) and ``--max-new-tokens``."""

    def __init__(self, model: ModelOptions, options: ExplainOptions | None = None) -> None:
        from ..cam.answers import answer_methods
        from ..cam.tasks.answer import ANSWER as adapter
        from ..pipeline.answers import answer_explainer

        options = options or ExplainOptions()
        self.answerer: Explainer = answer_explainer(model, replace(options, methods=options.methods[:1]))
        self.layer_note = adapter.layer_note(self.answerer.model, self.answerer.layer_label)
        self.empty = adapter.nothing_found(None, None, None) or "the answer is empty"
        self.default_layer = self.answerer.layer_label
        self.default_method = self.answerer.chosen.methods[0]
        self.methods = list(answer_methods())
        self.maps = MapStore()
        self.model_lock = threading.Lock()
        self._lock = threading.Lock()
        """Guards the kept answers (never held during a pass, unlike :attr:`model_lock`)."""
        self._asked: OrderedDict[str, Asked] = OrderedDict()
        self._whole: OrderedDict[str, str] = OrderedDict()
        """The whole answers' maps: the id of the answer each maps."""
        self._explainers: dict[tuple[str, str], Explainer] = {(self.default_layer, self.default_method): self.answerer}
        super().__init__()

    def info(self) -> dict[str, Any]:
        """What the page needs: ``answers`` (a question box instead of classes), the layer, the methods."""
        return {
            "model": self.answerer.model.name,
            "task": "answer",
            "answers": True,
            "ranked": False,
            "listed": "",
            "layers": [{"name": self.default_layer, "kind": "", "shape": [], "default": True}],
            "default_layer": self.default_layer,
            "methods": self.methods,
            "default_method": self.default_method,
            "kind": "answer",
            "targets": [],
            "faithfulness": True,
            "max_new_tokens": answer_score(self.answerer).max_new_tokens,
        }

    def explainer(self, layer: str | None, method: str | None) -> Explainer:
        """The explainer of ``layer`` and ``method`` (``None``: the defaults), sharing the loaded model."""
        layer, method = layer or self.default_layer, method or self.default_method
        if method not in self.methods:
            raise UsageError(f"unknown method {method!r} for an answer.{suggest(method, self.methods)}")
        key = (layer, method)
        if key not in self._explainers:
            base = self.answerer
            if len(self._explainers) >= MAX_EXPLAINERS:
                self._explainers.pop(next(iter(self._explainers)))
            self._explainers[key] = base.with_options(layers=(layer,), methods=(method,))
        return self._explainers[key]

    def asked(self, answer_id: str) -> Asked:
        """A kept answer; 404 once it is forgotten."""
        with self._lock:
            found = self._asked.get(answer_id)
        if found is None:
            raise HttpError(404, "this answer is no longer kept; ask the question again")
        return found

    def ask(
        self,
        source: Source,
        image: DecodedImage,
        prompt: str,
        given: str | None,
        layer: str | None,
        method: str | None,
    ) -> tuple[Asked, MapAnswer | None]:
        """The answer to ``prompt`` about the image (generated once, or ``given``) and its whole map (``None``: the
        answer is empty)."""
        from ..cam.answer_words import answer_words
        from ..cam.prompted import explain_answer

        with self.model_lock:
            explainer = self.explainer(layer, method)
            score = answer_score(explainer)
            key = map_id("answer", source.id, prompt, given)
            with self._lock:
                asked = self._asked.get(key)
            if asked is None:
                inputs = score.inputs(image.image, prompt)
                ids = score.generate(inputs) if given is None else score.encode(given)
                asked = Asked(key, source.id, source.stem, prompt, ids, given is None, "", [], [])
                whole = None
                if ids:
                    target = score.answer_targets(ids, False)[0]
                    result = explain_answer(explainer, image.image, prompt, ids, given is None, [target], inputs)
                    asked.text, asked.tokens = result.answer, result.tokens
                    asked.words = answer_words(score.tokenizer, ids)
                    whole = MapAnswer(self._store(asked, explainer, result.maps[0], image), True, target.label)
                with self._lock:
                    self._asked[key] = asked
                    while len(self._asked) > KEPT_ANSWERS:
                        self._asked.popitem(last=False)
                return asked, whole
        return asked, self.map(asked, image, None, layer, method) if asked.ids else None

    def map(
        self, asked: Asked, image: DecodedImage, word: int | None, layer: str | None, method: str | None
    ) -> MapAnswer:
        """The map of ``word`` of the kept answer (``None``: the whole answer), at ``layer`` with ``method``: kept,
        or one teacher-forced pass and one backward pass (nothing is generated)."""
        from ..cam.answer_words import word_target
        from ..cam.prompted import explain_answer

        with self.model_lock:
            explainer = self.explainer(layer, method)
            score = answer_score(explainer)
            if word is None:
                target = score.answer_targets(asked.ids, False)[0]
            else:
                target = word_target(score, asked.ids, asked.words[word])
            stored = self.maps.get(_key(asked, explainer, target))
            if stored is not None:
                return MapAnswer(stored, False, target.label)
            result = explain_answer(explainer, image.image, asked.prompt, asked.ids, asked.generated, [target])
            return MapAnswer(self._store(asked, explainer, result.maps[0], image), True, target.label)

    def curves(self, stored: StoredMap, image: DecodedImage, steps: int) -> dict[str, Any]:
        """``gradcam eval --prompt``'s figures for a whole answer's map (:mod:`gradcam_cli.evaluation.answers`):
        deletion and insertion of the answer's per-token probability along it, in ``steps``."""
        from ..evaluation.answers import answer_curves

        with self._lock:
            answer_id = self._whole.get(stored.id)
        if answer_id is None:
            raise UsageError("deletion and insertion are measured for the whole answer's map, as gradcam eval does")
        asked = self.asked(answer_id)
        with self.model_lock:
            explainer = self.explainer(stored.layer, stored.explanation.method)
            saliency = stored.explanation.saliency
            curves = answer_curves(answer_score(explainer), image.image, asked.prompt, asked.ids, saliency, steps)
        return {
            "steps": steps,
            "deletion_auc": curves.deletion_auc,
            "insertion_auc": curves.insertion_auc,
            "deletion": curves.deletion,
            "insertion": curves.insertion,
        }

    def _store(self, asked: Asked, explainer: Explainer, answer_map: Any, image: DecodedImage) -> StoredMap:
        target, score = answer_map.target, answer_map.score
        index = target.token if target.token is not None else -1
        prediction = Prediction(index, target.label, math.exp(min(score, 0.0)), details={"logprob": score})
        explanation = Explanation(answer_map.method, prediction, answer_map.saliency.detach().float().cpu())
        stored = StoredMap(
            _key(asked, explainer, target),
            asked.image,
            asked.stem,
            explainer.layer_label,
            explanation,
            [],
            image.pixels,
            file_name=answer_name(asked.stem, answer_map.method, target.label),
        )
        self.maps.put(stored)
        if target.label == "answer":
            with self._lock:
                self._whole[stored.id] = asked.id
                while len(self._whole) > KEPT_SOURCES:
                    self._whole.popitem(last=False)
        return stored


def _key(asked: Asked, explainer: Explainer, target: Any) -> str:
    return map_id(asked.id, explainer.layer_label, explainer.chosen.methods[0], target.label, target.terms)


def answer_routes(images: ImageStore, service: AnswerService | None) -> list[Route]:
    """The routes of :mod:`this module <gradcam_cli.serve.answers>`; without a vision-language model, each says
    that it needs one."""

    def needs() -> AnswerService:
        if service is None:
            raise HttpError(409, "questions are for a vision-language model (gradcam serve --model hf:DIR)")
        return service

    async def ask(request: Request) -> Response:
        answers = needs()
        body = await _json_body(request)
        image_id, prompt, given = body.get("image"), body.get("prompt"), body.get("answer") or None
        if not isinstance(image_id, str) or not image_id:
            raise HttpError(400, "image is required")
        if not isinstance(prompt, str) or not prompt.strip():
            raise HttpError(400, "type a question about the image")
        for name, text in (("the question", prompt), ("the answer", given)):
            if text is not None and (not isinstance(text, str) or len(text) > MAX_QUESTION):
                raise HttpError(400, f"{name}: text of at most {MAX_QUESTION} characters")
        layer, method = _name(body, "layer"), _name(body, "method")
        source, decoded = await blocking(lambda: images.decoded(image_id))
        asked, whole = await answers.run(lambda: answers.ask(source, decoded, prompt, given, layer, method))
        note = None if asked.ids else answers.empty
        return json_response({**asked.to_dict(), "map": whole.to_dict() if whole else None, "note": note})

    async def word_map(request: Request) -> Response:
        answers = needs()
        asked = answers.asked(request.path_params["id"])
        if not asked.words:
            raise HttpError(409, answers.empty)
        word = None if text_param(request, "word") is None else int_param(request, "word", 0, 0, len(asked.words) - 1)
        layer, method = text_param(request, "layer"), text_param(request, "method")
        _, decoded = await blocking(lambda: images.decoded(asked.image))
        answer = await answers.run(lambda: answers.map(asked, decoded, word, layer, method))
        return json_response(answer.to_dict())

    return [
        Route("/api/ask", guarded(ask), methods=["POST"]),
        Route("/api/answers/{id}/map", guarded(word_map)),
    ]


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (at most :data:`MAX_BODY` bytes); a 400 or 413 answer otherwise."""
    data = await read_body(request, MAX_BODY, f"the request is over {MAX_BODY:,} bytes")
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        raise HttpError(400, "the request is not JSON") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the request is not a JSON object")
    return body


def _name(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > 500):
        raise HttpError(400, f"{key}: a name of at most 500 characters")
    return value or None
