"""A vision-language model in the explorer (docs/serve.md): asked a question about an image, it answers as
``gradcam IMAGE --prompt TEXT`` does (greedy, seeded, ``--max-new-tokens``; or explains the answer typed, as
``--answer``), and shows the whole answer's map, then a clicked word's: the map ``--target answer:WORD`` (or
``--per-token``) writes, computed by the same :class:`~gradcam_cli.cam.explainer.Explainer`
(:mod:`gradcam_cli.cam.prompted`). The model is served by the one :class:`~gradcam_cli.serve.model.ModelService`,
as every model is (its thread, its lock, its explainers per layer and method, its maps); :class:`Answers` is what
the service keeps besides for a model asked questions: the answers (:data:`KEPT_ANSWERS`), so that a word's click,
or another layer or method, maps one without generating it again.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..cam.results import Explanation, Prediction
from ..cam.tasks.answer import AnswerScore, answer_score
from ..errors import UsageError
from ..io.naming import answer_name
from .http import HttpError, blocking, guarded, int_param, json_response, read_body, text_param
from .images import DecodedImage, ImageStore, Source
from .maps import MapAnswer, MapStore, StoredMap, map_id

if TYPE_CHECKING:
    from ..cam.answer_words import AnswerWord
    from ..cam.answers import AnswerToken
    from ..cam.explainer import Explainer
    from ..targets import TargetSpec

T = TypeVar("T")

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


class Served(Protocol):
    """What :class:`Answers` uses of the one service (:class:`~gradcam_cli.serve.model.ModelService`): its lock,
    its maps, its explainers (one per layer and method, built on first use) and its thread."""

    model_lock: threading.Lock
    maps: MapStore

    def explainer(self, layer: str | None, method: str | None, target: TargetSpec | None = None) -> Explainer: ...

    async def run(self, work: Callable[[], T]) -> T: ...


class Answers:
    """The answers the service of a vision-language model keeps (:data:`KEPT_ANSWERS`), each asked and mapped with
    the service's explainers under its lock (``explainer``: its first, which says how long an answer grows)."""

    def __init__(self, service: Served, explainer: Explainer) -> None:
        self.service = service
        self.empty = explainer.adapter.nothing_found(explainer.model, explainer.score, None) or "the answer is empty"
        self.max_new_tokens = answer_score(explainer).max_new_tokens
        self._lock = threading.Lock()
        """Guards the kept answers (never held during a pass, unlike the service's ``model_lock``)."""
        self._asked: OrderedDict[str, Asked] = OrderedDict()
        self._whole: OrderedDict[str, str] = OrderedDict()
        """The whole answers' maps: the id of the answer each maps."""

    @classmethod
    def of(cls, service: Served, explainer: Explainer) -> Answers | None:
        """The answers of ``explainer``'s model where it is asked questions (its task's score is the answer's:
        :class:`~gradcam_cli.cam.tasks.answer.AnswerScore`); ``None``: an image model's."""
        return cls(service, explainer) if isinstance(explainer.score, AnswerScore) else None

    def facts(self) -> dict[str, Any]:
        """What the page is told besides the model's: a question box instead of classes, and the answer's most
        tokens."""
        return {"answers": True, "kind": "answer", "max_new_tokens": self.max_new_tokens}

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

        with self.service.model_lock:
            explainer = self.service.explainer(layer, method)
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
                    whole = MapAnswer(self._store(asked, explainer, result.maps[0], image, True), True, target.label)
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

        with self.service.model_lock:
            explainer = self.service.explainer(layer, method)
            score = answer_score(explainer)
            if word is None:
                target = score.answer_targets(asked.ids, False)[0]
            else:
                target = word_target(score, asked.ids, asked.words[word])
            stored = self.service.maps.get(_key(asked, explainer, target))
            if stored is not None:
                return MapAnswer(stored, False, target.label)
            result = explain_answer(explainer, image.image, asked.prompt, asked.ids, asked.generated, [target])
            stored = self._store(asked, explainer, result.maps[0], image, word is None)
            return MapAnswer(stored, True, target.label)

    def curves(self, stored: StoredMap, image: DecodedImage, road: bool, steps: int) -> dict[str, Any]:
        """``gradcam eval --prompt``'s figures for a whole answer's map (:mod:`gradcam_cli.evaluation.answers`):
        deletion and insertion of the answer's per-token probability along it, in ``steps`` (``road``: refused)."""
        from ..evaluation.answers import answer_curves

        if road:
            raise HttpError(400, "ROAD is measured for a classifier's classes, not an answer")
        with self._lock:
            answer_id = self._whole.get(stored.id)
        if answer_id is None:
            raise UsageError("deletion and insertion are measured for the whole answer's map, as gradcam eval does")
        asked = self.asked(answer_id)
        with self.service.model_lock:
            explainer = self.service.explainer(stored.layer, stored.explanation.method)
            saliency = stored.explanation.saliency
            curves = answer_curves(answer_score(explainer), image.image, asked.prompt, asked.ids, saliency, steps)
        return {
            "steps": steps,
            "deletion_auc": curves.deletion_auc,
            "insertion_auc": curves.insertion_auc,
            "deletion": curves.deletion,
            "insertion": curves.insertion,
        }

    def _store(
        self, asked: Asked, explainer: Explainer, answer_map: Any, image: DecodedImage, whole: bool
    ) -> StoredMap:
        """Keep ``answer_map`` (``whole``: the whole answer's, which deletion and insertion measure)."""
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
        self.service.maps.put(stored)
        if whole:
            with self._lock:
                self._whole[stored.id] = asked.id
                while len(self._whole) > KEPT_SOURCES:
                    self._whole.popitem(last=False)
        return stored


def _key(asked: Asked, explainer: Explainer, target: Any) -> str:
    return map_id(asked.id, explainer.layer_label, explainer.chosen.methods[0], target.label, target.terms)


def answer_routes(images: ImageStore, answers: Answers | None) -> list[Route]:
    """The routes of :mod:`this module <gradcam_cli.serve.answers>`, for the service's ``answers``; without a
    vision-language model (``None``), each says that it needs one."""

    def needs() -> Answers:
        if answers is None:
            raise HttpError(409, "questions are for a vision-language model (gradcam serve --model hf:DIR)")
        return answers

    async def ask(request: Request) -> Response:
        asking = needs()
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
        asked, whole = await asking.service.run(lambda: asking.ask(source, decoded, prompt, given, layer, method))
        note = None if asked.ids else asking.empty
        return json_response({**asked.to_dict(), "map": whole.to_dict() if whole else None, "note": note})

    async def word_map(request: Request) -> Response:
        asking = needs()
        asked = asking.asked(request.path_params["id"])
        if not asked.words:
            raise HttpError(409, asking.empty)
        word = None if text_param(request, "word") is None else int_param(request, "word", 0, 0, len(asked.words) - 1)
        layer, method = text_param(request, "layer"), text_param(request, "method")
        _, decoded = await blocking(lambda: images.decoded(asked.image))
        answer = await asking.service.run(lambda: asking.map(asked, decoded, word, layer, method))
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
