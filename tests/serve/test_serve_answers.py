"""``gradcam serve`` with a vision-language model (the one ModelService, its answers: gradcam_cli/serve/answers.py):
a question about an image is answered as ``gradcam --prompt`` answers it, and the whole answer's and each word's map
are the maps the command line writes (``--save-raw``), compared through the page's 16-bit PNG. A tiny random LLaVA
(tests/vlm_models.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("starlette")

import vlm_models
from PIL import Image
from starlette.testclient import TestClient

from gradcam_cli.io.discovery import discover
from gradcam_cli.options import AnswerOptions, ExplainOptions, ModelOptions

LOCAL = "http://127.0.0.1"
PROMPT = "what is the cat ?"
QUANTUM = 1 / 65535


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return f"hf:{vlm_models.llava(tmp_path_factory.mktemp('llava'))}"


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("photos") / "halves.png"
    image = Image.new("RGB", (48, 32), (30, 30, 220))
    image.paste((220, 30, 30), (0, 0, 24, 32))
    image.save(path)
    return path


@pytest.fixture(scope="module")
def client(model, photo, tmp_path_factory):
    from gradcam_cli.serve import ModelService, create_app

    service = ModelService(ModelOptions(model), ExplainOptions(question=AnswerOptions(max_new_tokens=4)))
    app = create_app(service, discover([photo]), work_dir=tmp_path_factory.mktemp("work"))
    with TestClient(app, base_url=LOCAL) as test_client:
        yield test_client
    service.close()


def command_line(photo: Path, model: str, out: Path, *options: str) -> list[dict]:
    """``gradcam PHOTO --model MODEL --prompt PROMPT --save-raw --json OPTIONS``'s rows."""
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    args = [str(photo), "--model", model, "--prompt", PROMPT, "--save-raw", "-o", str(out), "--json", *options]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def served_map(client: TestClient, answer: dict) -> np.ndarray:
    """A map as the page reads it: the 16-bit values packed in the red and green channels of its PNG."""
    png = client.get(f"/api/maps/{answer['id']}.png")
    assert png.status_code == 200
    rgb = np.asarray(Image.open(io.BytesIO(png.content)).convert("RGB")).astype(np.float64)
    return (rgb[..., 0] * 256 + rgb[..., 1]) / 65535


def cli_map(row: dict) -> np.ndarray:
    """The map ``--save-raw`` wrote for a row (not all 0: a comparison that means something)."""
    saved = np.load(next(path for path in row["outputs"] if path.endswith(".npy")))
    assert saved.max() == pytest.approx(1.0)
    return saved


def ask(client: TestClient, **body) -> dict:
    response = client.post("/api/ask", json={"image": "i0", "prompt": PROMPT, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_answer_and_each_words_map_are_the_command_lines(client, model, photo, tmp_path, monkeypatch):
    from gradcam_cli.cam.answers import Prompter

    rows = command_line(photo, model, tmp_path / "cli", "--max-new-tokens", "4", "--per-token")
    generate = Prompter.generate
    calls: list[int] = []
    monkeypatch.setattr(Prompter, "generate", lambda self, inputs: calls.append(1) or generate(self, inputs))

    asked = ask(client)
    assert (asked["answer"], asked["generated"]) == (rows[0]["answer"], True)
    assert [t["id"] for t in asked["tokens"]] == [t["id"] for t in rows[0]["tokens"]]
    assert asked["map"]["target"]["name"] == "answer" and asked["map"]["name"] == "halves_gradcam_answer"
    np.testing.assert_allclose(served_map(client, asked["map"]), cli_map(rows[0]), atol=QUANTUM)
    npy = client.get(f"/api/maps/{asked['map']['id']}/map.npy")  # the download: --save-raw's array
    # serve computes on a worker thread whose intra-op thread count may differ from the command's, so its float32
    # sums run in another order: a few dozen float32 ulps of a map normalised to [0, 1] (3.6e-6 seen after other
    # tests had changed the main thread's count)
    np.testing.assert_allclose(np.load(io.BytesIO(npy.content)), cli_map(rows[0]), atol=100 * 2**-23)

    per_token = {row["target"]["token"]: row for row in rows[1:]}
    assert asked["words"], asked
    for k, word in enumerate(asked["words"]):
        shown = client.get(f"/api/answers/{asked['id']}/map", params={"word": k})
        assert shown.status_code == 200, shown.text
        (token,) = word["tokens"]  # a word-level tokenizer: one token a word
        np.testing.assert_allclose(served_map(client, shown.json()), cli_map(per_token[token]), atol=QUANTUM)
    again = ask(client)  # the same question: the kept answer and map
    assert again["id"] == asked["id"] and again["map"]["forward"] is False
    assert calls == [1]  # generated once: word clicks and the same question map the kept answer


def test_a_given_answer_and_a_repeated_word(client, model, photo, tmp_path):
    """``--answer``'s text field: its first "cat" is --target answer:cat's map, the second --per-token's token 4."""
    given = "a big cat a cat"
    options = ("--answer", given, "--target", "answer:cat", "--per-token", "--method", "layercam")
    rows = {row["target"]["name"]: row for row in command_line(photo, model, tmp_path / "cli", *options)}
    asked = ask(client, answer=given, method="layercam")
    assert (asked["answer"], asked["generated"]) == (given, False)
    assert [w["text"] for w in asked["words"]] == given.split()
    for word, name in ((2, "answer:cat"), (4, "token 4: cat")):
        shown = client.get(f"/api/answers/{asked['id']}/map", params={"word": word, "method": "layercam"}).json()
        assert (shown["target"]["name"], shown["method"]) == (name, "layercam")
        np.testing.assert_allclose(served_map(client, shown), cli_map(rows[name]), atol=QUANTUM)
    overlay = client.get(f"/api/maps/{shown['id']}/overlay.png")
    assert overlay.headers["content-disposition"].endswith('halves_layercam_token4-cat.png"')


def test_cross_site_requests_and_what_does_not_apply_are_refused(client):
    asked = ask(client, answer="a cat")
    evil = {"Origin": "http://evil.example"}
    assert client.post("/api/ask", json={"image": "i0", "prompt": PROMPT}, headers=evil).status_code == 403
    word = f"/api/answers/{asked['id']}/map?word=0"
    assert client.get(word, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert client.get(word, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200

    def refused(response, status: int, text: str) -> None:
        assert response.status_code == status and text in response.json()["error"], response.text

    refused(client.get("/api/map?image=i0"), 409, "ask one about the image")
    refused(client.get(f"/api/maps/{asked['map']['id']}/faithfulness?road=1"), 400, "ROAD")
    word_map = client.get(f"/api/answers/{asked['id']}/map?word=1").json()
    refused(client.get(f"/api/maps/{word_map['id']}/faithfulness"), 400, "the whole answer's map")
    refused(client.get(f"/api/answers/{asked['id']}/map?word=2"), 400, "word: 2 is not between 0 and 1")
    refused(client.get("/api/answers/0123/map"), 404, "ask the question again")
    refused(client.post("/api/ask", content=b"{", headers={"Content-Type": "application/json"}), 400, "not JSON")
    refused(client.post("/api/ask", json={"image": "i0", "prompt": " "}), 400, "type a question")
    refused(client.post("/api/ask", json={"image": "../x", "prompt": PROMPT}), 400, "not an image id")
    refused(client.post("/api/ask", json={"image": "i0", "prompt": PROMPT, "method": "scorecam"}), 400, "scorecam")
    info = client.get("/api/info").json()["model"]
    assert info["answers"] and info["curves"] and "scorecam" not in info["methods"]


def test_an_empty_answer_says_so(client, monkeypatch):
    from gradcam_cli.cam.answers import Prompter

    monkeypatch.setattr(Prompter, "generate", lambda self, inputs: [])
    asked = ask(client, prompt="what is the dog ?")
    assert (asked["answer"], asked["words"], asked["map"]) == ("", [], None)
    assert "answer is empty" in asked["note"]
    response = client.get(f"/api/answers/{asked['id']}/map")
    assert response.status_code == 409 and "answer is empty" in response.json()["error"]


def test_the_whole_answers_faithfulness_is_gradcam_evals(client, model, photo):
    from typer.testing import CliRunner

    from gradcam_cli.cli.eval import app

    options = ["--prompt", PROMPT, "--answer", "a big cat", "--method", "layercam", "--steps", "20", "--json"]
    result = CliRunner().invoke(app, [str(photo), "--model", model, *options])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    asked = ask(client, answer="a big cat", method="layercam")
    figures = client.get(f"/api/maps/{asked['map']['id']}/faithfulness").json()
    assert figures["steps"] == 20 and len(figures["deletion"]) == len(row["deletion"])
    for key in ("deletion_auc", "insertion_auc", "deletion", "insertion"):
        np.testing.assert_allclose(figures[key], row[key], atol=2e-6)


def test_the_command_refuses_what_does_not_apply_to_a_vision_language_model(model, photo):
    from typer.testing import CliRunner

    from gradcam_cli.cli.serve import app

    for options in (["--model", model, "--target", "class:1"], ["--model", "resnet18", "--max-new-tokens", "3"]):
        result = CliRunner().invoke(app, [str(photo), "--port", "0", *options])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and lines[-1].startswith("error: --"), result.output
        assert "serving on" not in result.output
