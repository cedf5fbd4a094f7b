"""``gradcam serve`` in a real browser: Playwright for Python driving Debian's headless chromium (no browser
download), against the app on uvicorn on 127.0.0.1. Skipped, with the reason, where either is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from headless_browser import Running
from PIL import Image

from gradcam_cli.io.discovery import discover
from gradcam_cli.options import ModelOptions

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "docs" / "examples" / "two.png"
LABELS = ROOT / "docs" / "examples" / "squares.txt"
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">.png'


def canvas_sum(page: Any) -> list[int]:
    """Per-channel sums of the main canvas's pixels."""
    return page.evaluate(
        """() => { const c = document.getElementById('view');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const s = [0, 0, 0];
        for (let i = 0; i < d.length; i += 4) { s[0] += d[i]; s[1] += d[i + 1]; s[2] += d[i + 2]; } return s; }"""
    )


def wait_caption(page: Any, text: str) -> None:
    """Wait for the caption to say ``text``; on a timeout, fail with what the page said instead (its status line)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    try:
        page.wait_for_function(
            "t => document.getElementById('caption').textContent.includes(t)", arg=text, timeout=60_000
        )
    except PageTimeout:
        said = page.evaluate(
            "() => [document.getElementById('caption').textContent, document.getElementById('status').textContent]"
        )
        raise AssertionError(f"the caption never said {text!r}: caption {said[0]!r}, status {said[1]!r}") from None


def test_upload_click_a_class_switch_layer_and_method(browser, square_model, tmp_path):
    from gradcam_cli.serve import ModelService, create_app

    server = Running(create_app(ModelService(square_model), work_dir=tmp_path))
    image = tmp_path / "squares.png"
    picture = Image.new("RGB", (64, 48), (0, 0, 255))
    picture.paste((255, 0, 0), (4, 4, 24, 24))
    picture.save(image)
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        page.set_input_files(
            "#upload", files=[{"name": HOSTILE, "mimeType": "image/png", "buffer": image.read_bytes()}]
        )
        wait_caption(page, "gradcam for blue")
        assert page.locator("#inputs option:checked").text_content() == HOSTILE  # shown as text, never as markup
        assert page.evaluate("document.body.dataset.pwned") is None and page.locator("img[src=x]").count() == 0
        blue = canvas_sum(page)
        page.click("#predictions button[data-index='0']")
        wait_caption(page, "gradcam for red at features (no forward pass)")
        red = canvas_sum(page)
        assert red != blue
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.select_option("#colormap", "gray")
        page.fill("#alpha", "0.9")
        page.dispatch_event("#alpha", "input")
        assert canvas_sum(page) != red and requests == []  # colours and opacity change without a request
        page.select_option("#method", "layercam")
        wait_caption(page, "layercam for red at features")
        page.select_option("#layer", "features.0")
        wait_caption(page, "layercam for red at features.0")
        page.click("#compare-add")
        assert page.locator("#compare figure").count() == 1
        assert "/overlay.png?colormap=gray" in (page.get_attribute("#dl-overlay", "href") or "")
        shown = canvas_sum(page)
        page.fill("#target", "contrast:blue,red")  # a --target typed in the field
        page.press("#target", "Enter")
        wait_caption(page, "layercam for blue - red at features.0")
        assert canvas_sum(page) != shown
        page.fill("#target", "simlar:x.png")
        page.click("#target-go")
        page.wait_for_function("() => document.getElementById('status').textContent.includes('Did you mean: similar')")
    finally:
        page.close()
        server.stop()


def test_run_view_filter_and_paging(browser, tmp_path):
    from gradcam_cli.serve import create_app

    run = tmp_path / "out"
    run.mkdir()
    rows = []
    for n in range(60):
        if n % 10 == 0:
            rows.append({"input": f"in/{n}.png", "status": "error", "error": "<b>bad</b> file", "outputs": []})
        else:
            target = {"index": n % 3, "name": ["red", "green", "blue"][n % 3], "probability": 0.5}
            rows.append({"input": f"in/{n}.png", "status": "ok", "outputs": [], "target": target,
                         "predictions": [target], "method": "gradcam", "layer": "features"})  # fmt: skip
    (run / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    server = Running(create_app(None, run_dir=run, manifest=run / "manifest.jsonl", work_dir=tmp_path / "work"))
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        assert page.text_content("#page-label") == "1-25 of 60"
        page.click("#next")
        page.wait_for_function("() => document.getElementById('page-label').textContent === '26-50 of 60'")
        assert page.locator("#rows-body tr").first.get_attribute("data-row") == "25"
        page.select_option("#f-status", "error")
        page.click("#f-apply")
        page.wait_for_function("() => document.getElementById('page-label').textContent === '1-6 of 6'")
        assert page.locator("#rows-body tr.failed").count() == 6
        assert page.locator("#rows-body b").count() == 0  # the error's markup is text
        page.locator("#rows-body tr").first.click()
        assert page.text_content("#row-detail p") == "<b>bad</b> file"
    finally:
        page.close()
        server.stop()


def test_click_a_detection(browser, tmp_path):
    from gradcam_cli.serve import ModelService, create_app

    service = ModelService(ModelOptions(f"{ROOT}/tests/task_models.py:build_detector", labels=LABELS))
    server = Running(create_app(service, discover([TWO]), work_dir=tmp_path))
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        page.select_option("#inputs", "i0")
        wait_caption(page, "gradcam for ")
        assert page.locator("#predictions button").all_text_contents()[1:] == ["red 99.9%", "green 99.9%"]
        combined = canvas_sum(page)
        page.click("#predictions button:has-text('green')")
        wait_caption(page, "gradcam for green")
        assert canvas_sum(page) != combined
        assert not page.is_visible("#faith")  # measured against boxes by gradcam eval, not here
        page.fill("#target", "red")
        page.press("#target", "Enter")  # a class typed on a detector: said, not ignored
        page.wait_for_function("() => document.getElementById('status').textContent.includes('click a detection')")
    finally:
        page.close()
        server.stop()


def test_an_embedding_model_is_asked_through_the_target_field(browser, tmp_path):
    from gradcam_cli.models.loading import load_model
    from gradcam_cli.serve import ModelService, create_app

    scene = Image.new("RGB", (64, 48), (128, 128, 128))
    scene.paste((255, 0, 0), (4, 4, 24, 24))
    scene.save(tmp_path / "scene.png")
    Image.new("RGB", (32, 32), (255, 0, 0)).save(tmp_path / "ref.png")
    model = load_model(f"{ROOT}/tests/embedding_model.py:build", "none", task="classify")
    model = model.with_profile(embeds=True)  # no classes: no predictions to list
    server = Running(create_app(ModelService(model), discover([tmp_path]), work_dir=tmp_path / "work"))
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        scene_id = page.locator("#inputs option", has_text="scene.png").get_attribute("value") or ""
        page.select_option("#inputs", scene_id)
        page.wait_for_function("() => document.getElementById('status').textContent.includes('type a target')")
        page.fill("#target", "similar:ref.png")
        page.press("#target", "Enter")
        wait_caption(page, "gradcam for similar:ref.png at features")
        assert page.locator("#predictions li").count() == 0 and max(canvas_sum(page)) > 0
        assert page.evaluate("document.getElementById('view').width") == 64  # the map, drawn
    finally:
        page.close()
        server.stop()


def test_the_image_view_opens_on_the_first_input_pages_searches_and_keeps_uploads(browser, square_model, tmp_path):
    from gradcam_cli.serve import ModelService, create_app

    folder = tmp_path / "photos"
    folder.mkdir()
    for n in range(205):  # more than one page of inputs (and than the 200 the page once listed)
        Image.new("RGB", (16, 12), (255, 0, 0) if n % 2 else (0, 255, 0)).save(folder / f"img{n:05d}.png")
    run = tmp_path / "out"
    run.mkdir()
    target = {"index": 0, "name": "red", "probability": 0.7}
    rows = [{"input": "gone/missing.png", "status": "ok", "outputs": [], "target": target, "predictions": [target]}]
    (run / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    app = create_app(
        ModelService(square_model), discover([folder]), run, run / "manifest.jsonl", work_dir=tmp_path / "work"
    )
    server = Running(app)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        wait_caption(page, "gradcam for green at features")  # opened on the first input, nothing chosen
        assert page.text_content("#inputs-label") == "1-50 of 205" and page.locator("#strip button").count() == 50
        assert page.locator("#strip button.chosen").get_attribute("data-id") == "i0"
        assert page.evaluate("document.getElementById('view').width") == 16
        assert page.evaluate("document.getElementById('view').getBoundingClientRect().width") >= 320  # scaled up
        assert page.is_visible("#faith")  # a classifier's class map: faithfulness applies
        for _ in range(4):
            page.click("#inputs-next")
        page.wait_for_function("() => document.getElementById('inputs-label').textContent === '201-205 of 205'")
        page.fill("#input-q", "img00203")
        page.wait_for_function("() => document.getElementById('inputs-label').textContent === '1-1 of 1'")
        page.click("#strip button[data-id='i203']")
        page.wait_for_function("() => document.getElementById('view').dataset.mapId !== undefined")
        wait_caption(page, "gradcam for red")
        page.set_input_files("#upload", files=[{"name": "mine.png", "mimeType": "image/png", "buffer": png_bytes()}])
        wait_caption(page, "gradcam for blue")
        page.reload()
        page.wait_for_selector("body[data-ready='1']")
        page.fill("#input-q", "mine")
        page.wait_for_function("() => document.getElementById('inputs-label').textContent === '1-1 of 1'")
        assert page.locator("#inputs option", has_text="mine.png").count() == 1  # the upload is still listed
        page.fill("#target", "contrast:red,green")
        page.press("#target", "Enter")
        wait_caption(page, "gradcam for red - green")
        assert not page.is_visible("#faith")  # not a class: gradcam eval measures it, not this button
        page.click("#tab-run")
        page.fill("#f-pmin", "abc")
        page.click("#f-apply")
        page.wait_for_function("() => document.getElementById('status').textContent.includes('not a percentage')")
        page.fill("#f-pmin", "50")
        page.click("#f-apply")
        page.wait_for_function("() => document.getElementById('status').textContent === ''")
        assert page.text_content("#page-label") == "1-1 of 1"  # 70 % >= 50 %
        page.locator("#rows-body tr").first.click()
        page.click("#row-detail button")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('error: ')")
        assert "missing.png" in (page.text_content("#status") or "") or "no such" in (
            page.text_content("#status") or ""
        )
    finally:
        page.close()
        server.stop()
    assert errors == []  # no uncaught script error


def png_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (20, 16), (0, 0, 255)).save(buffer, "PNG")
    return buffer.getvalue()


def test_ask_a_vision_language_model_and_click_a_word(browser, tmp_path):
    """``gradcam serve PHOTO --model hf:DIR`` as users start it (a subprocess): type a question, see the answer's
    words and its map, click a word, see that word's map."""
    import os
    import select
    import signal
    import subprocess
    import sys

    pytest.importorskip("transformers")
    import vlm_models

    folder = vlm_models.llava(tmp_path / "llava")
    photo = tmp_path / "halves.png"
    picture = Image.new("RGB", (48, 32), (30, 30, 220))
    picture.paste((220, 30, 30), (0, 0, 24, 32))
    picture.save(photo)
    command = [sys.executable, "-m", "gradcam_cli", "serve", str(photo), "--model", f"hf:{folder}", "--port", "0"]
    command += ["--max-new-tokens", "4"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 300)  # a hang guard, never a timing
        line = process.stdout.readline() if ready else ""
        assert line.startswith("serving on http://127.0.0.1:"), line
        page.goto(line.split()[2])
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_function("() => document.getElementById('status').textContent.includes('ask a question')")
        assert not page.is_visible("#predictions") and not page.is_visible("#target") and not page.is_visible("#faith")
        page.fill("#prompt", "what is the cat ?")
        page.press("#prompt", "Enter")
        wait_caption(page, "gradcam for answer at model.multi_modal_projector")
        assert page.text_content("#answer-note").startswith("Answer: ") and page.is_visible("#faith")
        assert page.locator("#answer-words button").count() >= 2  # the whole answer, then its words
        page.fill("#given", "a big cat")  # explain this answer instead
        page.click("#ask")
        wait_caption(page, "gradcam for answer at")
        page.wait_for_function("() => document.getElementById('answer-note').textContent.startsWith('Given answer')")
        assert page.locator("#answer-words button").all_text_contents() == ["whole answer", "a", "big", "cat"]
        whole = canvas_sum(page)
        page.click("#answer-words button:has-text('big')")
        wait_caption(page, "gradcam for answer:big at model.multi_modal_projector")
        assert canvas_sum(page) != whole
        assert page.locator("#answer-words button.chosen").text_content() == "big"
        assert not page.is_visible("#faith")  # measured for the whole answer (as gradcam eval), not a word
        page.select_option("#method", "layercam")  # the same word, another method
        wait_caption(page, "layercam for answer:big")
        assert errors == []
    finally:
        page.close()
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        finally:
            process.kill()
            process.wait()


def test_the_run_view_shows_a_tab_in_a_name_as_the_console_does(browser, tmp_path):
    """Issue 41, item 17: a tab in a row's file name reads ``\\t`` in the run view (its table and its detail), as
    the console and the gallery show it (``io/display.py``'s ``displayable``), never as blank space."""
    from gradcam_cli.io.display import displayable
    from gradcam_cli.serve import create_app

    run = tmp_path / "out"
    run.mkdir()
    name = "in/tab\there\x1b.png"
    row = {"input": name, "status": "error", "error": "not an image", "outputs": []}
    (run / "manifest.jsonl").write_text(json.dumps(row) + "\n")
    server = Running(create_app(None, run_dir=run, manifest=run / "manifest.jsonl", work_dir=tmp_path / "work"))
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector("#rows-body tr")
        shown = "in/tab\\there\\x1b.png"
        assert displayable(name) == shown
        assert page.locator("#rows-body tr td").nth(1).text_content() == shown
        page.locator("#rows-body tr").first.click()
        assert page.text_content("#row-detail h3") == shown
    finally:
        page.close()
        server.stop()


FRAME_COLOUR = """([r, g, b]) => { const img = document.getElementById('frame-view');
    if (!img || !img.complete || !img.naturalWidth) return false;
    const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
    const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data; const s = [0, 0, 0];
    for (let i = 0; i < d.length; i += 4) { s[0] += d[i]; s[1] += d[i + 1]; s[2] += d[i + 2]; }
    const n = d.length / 4;
    return Math.abs(s[0] / n - r) < 12 && Math.abs(s[1] / n - g) < 12 && Math.abs(s[2] / n - b) < 12; }"""
"""Whether the scrubber's frame is loaded and shows the colour (each channel's mean within 12 of it)."""


def test_the_frame_scrubber_of_a_clip_row_shows_the_frame_it_is_moved_to(browser, tmp_path):
    from clip_outputs import FRAMES, clip_records, frame_colour, write_manifest

    from gradcam_cli.serve import create_app

    run = tmp_path / "out"
    manifest = write_manifest(run / "manifest.jsonl", clip_records(run))
    server = Running(create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work"))
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        page.locator("#rows-body tr").first.click()
        page.wait_for_function(
            "n => document.getElementById('frame-scrub').max === String(n - 1)", arg=FRAMES, timeout=60_000
        )
        page.wait_for_function(FRAME_COLOUR, arg=list(frame_colour(0)), timeout=60_000)
        assert page.text_content("#frame-label") == f"1 of {FRAMES} (0.00 s)"
        page.fill("#frame-scrub", "4")  # a range input: the value set, and an input event
        page.wait_for_function(FRAME_COLOUR, arg=list(frame_colour(4)), timeout=60_000)
        assert page.text_content("#frame-label") == f"5 of {FRAMES} (0.40 s)"
        assert page.get_attribute("#frame-view", "data-frame") == "4"
        assert page.text_content("#status") == ""
    finally:
        page.close()
        server.stop()
