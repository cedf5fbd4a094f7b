"""--report: a static, self-contained index.html built from the run's records, checked in headless Chromium."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from urllib.parse import unquote

import numpy as np
import pytest
from headless_browser import browse
from PIL import Image

from gradcam_cli.cam.records import Record
from gradcam_cli.cam.results import Prediction
from gradcam_cli.io.naming import thumbnail_path
from gradcam_cli.render.gallery import PAGE_SIZE, gallery_entries, write_gallery

HANG_GUARD = 600
"""Seconds a browser run may take before a test gives up: a guard against hangs, never a measure of speed."""


def _record(name: str, out: Path, k: int = 0, status: str = "ok", error: str | None = None) -> Record:
    predictions = [Prediction(i, f"class {i}", 0.5 / (i + 1)) for i in range(5)]
    if status != "ok":
        return Record(name, status, "m", "layer4", error=error)
    stem = Path(name).stem
    outputs = [str(out / f"{stem}_gradcam_{k}-class-{k}.png"), str(out / f"{stem}_panel.png")]
    return Record(name, "ok", "m", "layer4", "gradcam", predictions[k], predictions, outputs)


def _data(page: str) -> list[dict]:
    match = re.search(r'<script id="gallery-data" type="application/json">(.*?)</script>', page, re.S)
    assert match
    return json.loads(match.group(1))


@pytest.mark.quick
def test_entries_merge_rows_per_image_and_link_relatively(tmp_path: Path) -> None:
    out = tmp_path / "out"
    records = [
        _record("imgs/b cat#1.jpg", out, 0),
        _record("imgs/b cat#1.jpg", out, 1),
        _record("imgs/a.jpg", out, 0),
        _record("imgs/broken.jpg", out, status="error", error="imgs/broken.jpg: not an image"),
        Record("imgs/old.jpg", "skipped", "m", "layer4"),
    ]
    entries = gallery_entries(records, out)
    assert [e["name"] for e in entries] == ["imgs/a.jpg", "imgs/b cat#1.jpg", "imgs/broken.jpg", "imgs/old.jpg"]
    cat = entries[1]
    assert cat["status"] == "ok" and len(cat["views"]) == 2
    assert cat["views"][1]["target"] == ["class 1", 0.25, 1]
    assert cat["views"][0]["href"] == "b%20cat%231_gradcam_0-class-0.png"  # relative and percent-encoded
    assert cat["files"] == [["panel", "b%20cat%231_panel.png"]]  # the per-image panel once, not per row
    assert cat["src"] == "../imgs/b%20cat%231.jpg" or cat["src"].endswith("imgs/b%20cat%231.jpg")
    assert entries[2]["status"] == "error" and entries[2]["error"] == "not an image"  # the path is shown before it
    assert entries[3]["status"] == "skipped"


def test_gallery_shows_skipped_rows_with_outputs_as_full_cards(tmp_path):
    """A resumed run's skipped images carry their earlier rows: full cards, with status skipped (the page says
    "outputs from an earlier run"); a probability rebuilt from a file name is unknown: null, not NaN."""
    earlier = _record("a.jpg", tmp_path, 1)
    skipped = Record("a.jpg", "skipped", "m", "layer4", "gradcam", earlier.target, earlier.predictions, earlier.outputs)
    rebuilt = Record(
        "b.jpg",
        "skipped",
        "m",
        "layer4",
        "gradcam",
        Prediction(2, "class 2", float("nan")),
        [],
        [str(tmp_path / "b_gradcam_2-class-2.png")],
    )
    a, b = gallery_entries([skipped, rebuilt], tmp_path)
    assert a["status"] == "skipped" and a["views"][0]["target"] == ["class 1", 0.25, 1] and len(a["predictions"]) == 5
    assert a["views"][0]["href"] == "a_gradcam_1-class-1.png" and a["files"] == [["panel", "a_panel.png"]]
    assert b["status"] == "skipped" and b["views"][0]["target"] == ["class 2", None, 2]
    assert "NaN" not in json.dumps(b)


@pytest.mark.quick
def test_page_is_self_contained_and_never_embeds_images(tmp_path: Path) -> None:
    out = tmp_path / "out"
    overlay = out / "a_gradcam_0-class-0.png"
    out.mkdir()
    Image.fromarray(np.full((300, 400, 3), 200, np.uint8)).save(overlay)
    failed = _record("bad.jpg", out, status="error", error="bad.jpg: </script><b>boom</b>")
    records = [_record("a.jpg", out), failed]
    path = write_gallery(records, out)
    page = path.read_text()
    assert path == out / "index.html"
    assert "base64" not in page and "data:image" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # no external resources
    assert "</script><b>" not in page and "&lt;/script&gt;&lt;b&gt;boom" in page  # escaped in HTML and JSON
    failed = re.search(r'<ul class="failures">(.*?)</ul>', page)
    assert failed and failed.group(1).count("bad.jpg") == 2  # the link's href and its text; the reason once
    assert 'loading: "lazy"' in page
    thumb = thumbnail_path(out, overlay)  # made from the overlay file, since no run wrote it
    assert thumb == out / "_thumbs" / "a_gradcam_0-class-0.jpg" and thumb.is_file()
    with Image.open(thumb) as image:
        assert max(image.size) <= 192
    assert _data(page)[0]["views"][0]["thumb"] == "_thumbs/a_gradcam_0-class-0.jpg"
    assert sorted(p.name for p in out.iterdir()) == ["_thumbs", "a_gradcam_0-class-0.png", "index.html"]


def test_many_images_stay_small(tmp_path: Path) -> None:
    out = tmp_path / "out"
    records = [_record(f"d{i // 100}/img{i:05d}.jpg", out / f"d{i // 100}", k) for i in range(1000) for k in (0, 1)]
    page = write_gallery(records, out).read_text()
    assert len(_data(page)) == 1000
    assert len(page) < 1_000 * 1_000  # under 1 kB per image (two views each): links and captions, never pixels


# ---------------------------------------------------------------------------------------------- headless Chromium


def _python_steps(run: Callable[[], object]) -> int:
    """How many Python lines, calls and returns ``run()`` executes: a measure of work that no load can change."""
    steps = 0

    def count(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal steps
        steps += 1
        return count

    previous = sys.gettrace()  # a coverage tracer, say, takes over again afterwards
    sys.settrace(count)
    try:
        run()
    finally:
        sys.settrace(previous)
    return steps


def _shown(dom: str) -> tuple[int, int]:
    match = re.search(r'id="cards"[^>]*data-shown="(\d+)"[^>]*data-total="(\d+)"', dom)
    assert match, "the gallery script did not run"
    return int(match.group(1)), int(match.group(2))


@pytest.mark.slow
def test_gallery_of_a_real_run_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    """gradcam DIR --report --panel: Chromium shows one card per input (the failure too) and a non-blank page."""
    from square_model import CLI_OPTIONS, square_image
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    images = tmp_path / "in"
    images.mkdir()
    for colour, box in (("red", (20, 20, 120, 120)), ("green", (200, 100, 300, 200)), ("blue", (300, 40, 400, 140))):
        square_image(box=box, colour=colour).save(images / f"{colour}.png")
    (images / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "out"
    args = [str(images), *CLI_OPTIONS, "-o", str(out), "--top-k", "2", "--report", "--panel", "--workers", "0"]
    result = CliRunner().invoke(app, [*args, "--labels", str(_labels(tmp_path))])
    assert result.exit_code == 1, result.output  # the broken file fails; the rest is explained
    index = out / "index.html"
    assert index.is_file()
    assert len(list((out / "_thumbs").glob("*.jpg"))) == 3 * 2

    dom = browse(chromium, tmp_path, index.as_uri(), "--dump-dom")
    assert _shown(dom) == (4, 4)
    assert dom.count('<article class="card') == 4
    assert dom.count('<article class="card error"') == 1
    assert dom.count('loading="lazy"') == 3 * 2
    assert "1 failed" in dom and "broken.png" in dom
    assert "showing 1\u20134 of 4 images" in dom

    shot = tmp_path / "shot.png"
    browse(chromium, tmp_path, index.as_uri(), f"--screenshot={shot}", "--window-size=1200,900")
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    assert pixels.shape[:2] == (900, 1200)
    assert pixels.std() > 20  # not a blank page
    saturated = (pixels.max(axis=2) - pixels.min(axis=2)) > 100
    assert saturated.mean() > 0.01  # the coloured overlay thumbnails are drawn


@pytest.mark.slow
def test_ten_thousand_entries_page_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    out = tmp_path / "out"
    records = [_record(f"d/img{i:05d}.jpg", out, 0) for i in range(10_000)]
    tenth = _python_steps(lambda: write_gallery(records[:1_000], out))
    index = out / "index.html"
    # linear work: ten times the records take at most 11 times the Python steps (a quadratic page: about 100)
    assert _python_steps(lambda: write_gallery(records, out)) <= 11 * tenth
    assert index.stat().st_size < 6_000_000
    assert _shown(browse(chromium, tmp_path, index.as_uri(), "--dump-dom")) == (PAGE_SIZE, 10_000)
    dom = browse(chromium, tmp_path, index.as_uri() + "#page=167", "--dump-dom")
    assert _shown(dom) == (10_000 - 166 * PAGE_SIZE, 10_000)
    assert "showing 9961\u201310000 of 10000 images (page 167 of 167)" in dom


@pytest.mark.slow
def test_a_resumed_runs_gallery_shows_earlier_outputs_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    """--skip-existing --report without a manifest: every card has its thumbnails and classes (probability
    unknown, so none is shown) and says its outputs are from an earlier run."""
    from square_model import square_image
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    images = tmp_path / "in"
    images.mkdir()
    for colour in ("red", "green", "blue"):
        square_image(colour=colour).save(images / f"{colour}.png")
    model = Path(__file__).parents[1].joinpath("square_model.py")
    args = [str(images), "-m", f"{model}:build", "-o", str(tmp_path / "out"), "--top-k", "2", "--workers", "0"]
    args += ["--labels", str(_labels(tmp_path))]
    assert CliRunner().invoke(app, args).exit_code == 0
    resumed = CliRunner().invoke(app, [*args, "--skip-existing", "--report"])
    assert resumed.exit_code == 0, resumed.output
    dom = browse(chromium, tmp_path, (tmp_path / "out" / "index.html").as_uri(), "--dump-dom")
    assert _shown(dom) == (3, 3)
    assert dom.count('<article class="card skipped"') == 3
    assert dom.count('loading="lazy"') == 3 * 2
    assert dom.count("<p>skipped: outputs from an earlier run</p>") == 3
    assert "NaN" not in dom and "0.0%" not in dom
    assert re.search(r'<span class="p">\(#\d\)</span>', dom)


def _labels(tmp_path: Path) -> Path:
    path = tmp_path / "labels.txt"
    path.write_text("red\ngreen\nblue\n")
    return path


def test_the_gallery_of_an_attention_run_shows_each_methods_map(tmp_path: Path) -> None:
    """--report on a tiny timm ViT explained with rollout and attn-grad: every image's card holds one view per
    method, each linking to the overlay written (the command line, as users run it)."""
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    images = tmp_path / "in"
    images.mkdir()
    rng = np.random.default_rng(0)
    for k, (width, height) in enumerate([(64, 48), (40, 40)]):
        pixels = (rng.random((height, width, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(images / f"{k}.png")
    out = tmp_path / "out"
    vit = f"{Path(__file__).parents[1] / 'attention_models.py'}:build_vit"
    args = [images, "-m", vit, "--input-size", "32,32", "--method", "rollout,attn-grad", "-t", 1, "--report", "-o", out]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    entries = _data((out / "index.html").read_text(encoding="utf-8"))
    assert [Path(entry["name"]).name for entry in entries] == ["0.png", "1.png"]
    for entry in entries:
        assert entry["status"] == "ok"
        hrefs = [view["href"] for view in entry["views"]]
        assert sorted(href.split("_")[1] for href in hrefs) == ["attn-grad", "rollout"]
        assert all((out / href).is_file() for href in hrefs)


PLANE_COUNTS = {"axial": 5, "coronal": 7, "sagittal": 3}


def _clip_and_scan_run(out: Path) -> list[Record]:
    """A run with a video model's two clip rows and a scan's row, their names needing escapes; the scan's strips of
    five axial, seven coronal and three sagittal slices written where the run writes them."""
    from clip_outputs import clip_records

    from gradcam_cli.io.naming import slices_path

    stem = 'w<b>"&#1'
    records = clip_records(out, stem)
    nifti = out / "scans" / "head_gradcam_1-liver.nii.gz"
    montage = nifti.with_name("head_gradcam_1-liver_montage.png")
    montage.parent.mkdir(parents=True)
    for path in (nifti, montage):
        path.write_bytes(b"")
    for plane, count in PLANE_COUNTS.items():
        strip = slices_path(out, nifti, plane)
        strip.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((count * 16, 16, 3), np.uint8)).save(strip)
    liver = Prediction(1, "liver", 0.1)
    records.append(Record("scans/head.nii.gz", "ok", "m", "net", "gradcam", liver, [liver], [str(nifti), str(montage)]))
    return records


@pytest.mark.quick
def test_a_clips_card_plays_its_video_beside_its_curve_and_a_scans_card_slides_through_its_slices(tmp_path):
    out = tmp_path / "out"
    page = write_gallery(_clip_and_scan_run(out), out).read_text()
    clip, scan = sorted(_data(page), key=lambda entry: entry["name"].startswith("scans"))
    (video,) = clip["views"]  # the two clips share their overlay video's view
    assert video["kind"] == "video" and video["href"] == "w%3Cb%3E%22%26%231_gradcam_top1.mp4"
    assert video["curve"] == "w%3Cb%3E%22%26%231_gradcam_top1_curve.png"
    (volume,) = scan["views"]
    assert volume["planes"] == [
        {  # no peak known (the row has no volume, its NIfTI no header): from the middle slice
            "plane": plane,
            "src": f"_thumbs/scans/head_gradcam_1-liver.nii_{plane}_slices.jpg",
            "count": count,
            "start": (count - 1) // 2,
        }
        for plane, count in PLANE_COUNTS.items()
    ]
    for link in (video["href"], video["curve"], volume["href"], *(shown["src"] for shown in volume["planes"])):
        assert ".." not in link and ":" not in link and not link.startswith("/")
        assert (out / unquote(link)).resolve().is_relative_to(out.resolve()) and (out / unquote(link)).is_file()
    assert 'w<b>"' not in page and "w\\u003cb>" in page  # the name only inside the JSON, its "<" escaped
    for made in ('el("video"', "muted = true", 'loop: ""', 'controls: ""', 'type: "range"'):
        assert made in page


@pytest.mark.slow
def test_the_clip_and_scan_cards_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    out = tmp_path / "out"
    index = write_gallery(_clip_and_scan_run(out), out)
    dom = browse(chromium, tmp_path, index.as_uri(), "--dump-dom")
    assert _shown(dom) == (2, 2)
    video = re.search(r"<video [^>]*>", dom)
    assert video and all(f'{name}=""' in video.group(0) for name in ("controls", "muted", "loop", "playsinline"))
    assert 'src="w%3Cb%3E%22%26%231_gradcam_top1.mp4"' in video.group(0)
    assert re.search(r'<img class="curve" src="w%3Cb%3E%22%26%231_gradcam_top1_curve.png"', dom)
    assert re.search(r'<a class="open" href="w%3Cb%3E%22%26%231_gradcam_top1.mp4">video</a>', dom)
    assert re.search(r'<input type="range" min="0" max="4" step="1" value="2" aria-label="axial slice">', dom)
    assert 'data-slice="2"' in dom and "translateY(-40%)" in dom and "axial slice 3 of 5" in dom
    assert "<b>" not in dom.split("<main", 1)[1]  # the name shown as text


@pytest.mark.slow
def test_a_video_runs_card_plays_its_webm_preview_in_chromium(tmp_path: Path, chromium: str) -> None:
    """gradcam VIDEO --report: Playwright drives Debian's Chromium to the card's video, which loads (its WebM: the
    mp4v overlay it could not decode) and, played, advances."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the [serve] extra) is not installed")
    from clip_outputs import write_video
    from square_model import CLI_OPTIONS
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    video = write_video(tmp_path / "in" / "walk.mp4", frames=30)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [str(video), *CLI_OPTIONS, "-o", str(out), "--report", "--workers", "0"])
    assert result.exit_code == 0, result.output
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto((out / "index.html").as_uri())
            player = page.locator("video")
            assert player.count() == 1
            assert player.get_attribute("src") == "_thumbs/walk_gradcam_top1.webm"
            assert page.locator("a.open").get_attribute("href") == "walk_gradcam_top1.mp4"  # the full overlay
            timeout = HANG_GUARD * 1000
            shown = "const v = document.querySelector('video');"
            # loaded, or failed (as mp4v does: MEDIA_ERR_SRC_NOT_SUPPORTED, at once)
            page.wait_for_function(
                f"() => {{ {shown} return v.readyState >= 2 || v.error !== null; }}", timeout=timeout
            )
            assert page.evaluate(f"() => {{ {shown} return v.error && v.error.code; }}") is None
            assert page.evaluate(f"() => {{ {shown} return [v.videoWidth, v.videoHeight]; }}") == [48, 32]
            page.evaluate(f"() => {{ {shown} return v.play(); }}")  # muted: no gesture needed
            page.wait_for_function(f"() => {{ {shown} return v.currentTime > 0; }}", timeout=timeout)
        finally:
            browser.close()
