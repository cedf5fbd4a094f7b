"""A scan's map in a real browser (Playwright driving Debian's headless chromium: tests/headless_browser.py): the
gallery's card shows the axial, coronal and sagittal planes, each slider showing the slice it is moved to (the
strip's square, as the run wrote it); ``gradcam serve``'s run view shows the three planes through the peak, a slider
moving a plane to the slice drawn on the server for it, and another class showing that class's map (each picture
the montage's drawing of that plane, pixel for pixel). Skipped, with the reason, where either is missing."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from headless_browser import Running
from PIL import Image
from scan_outputs import HOT, expected_slice, scan_run
from volume_models import CT_SHAPE

pytestmark = pytest.mark.slow
nibabel = pytest.importorskip("nibabel")

PIXELS = """id => { const img = document.getElementById(id);
    const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
    const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
    return [c.height, c.width, Array.from(ctx.getImageData(0, 0, c.width, c.height).data)]; }"""
"""An image's RGBA pixels as the page decoded them: [height, width, flat data]."""
LOADED = """([id, src]) => { const img = document.getElementById(id);
    return img && img.complete && img.naturalWidth > 0 && img.getAttribute('src') === src; }"""


def shown(page: Any, element: str) -> torch.Tensor:
    height, width, data = page.evaluate(PIXELS, element)
    return torch.tensor(data, dtype=torch.uint8).reshape(height, width, 4)[..., :3]


def test_the_gallery_card_slides_each_plane_through_its_slices(browser, tmp_path):
    from gradcam_cli.render.gallery import write_gallery

    out = tmp_path / "out"
    _, records = scan_run(out, report=True)
    index = write_gallery(records, out)
    page = browser.new_page(device_scale_factor=1)
    try:
        page.goto(index.as_uri())
        page.wait_for_selector(".slices[data-plane='sagittal'] img")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('img.strip')).every(i => i.complete && i.naturalWidth > 0)"
        )
        card = page.locator("article.card").first
        assert card.locator("figure").count() == 2  # the two classes' maps, each its three planes
        figure = card.locator("figure").first
        planes = figure.locator(".slices")
        assert [planes.nth(k).get_attribute("data-plane") for k in range(3)] == ["axial", "coronal", "sagittal"]
        # each plane from its slice through the peak (sagittal: counted from the left, against CT_AFFINE's x)
        starts = (HOT[1][2], HOT[1][1], CT_SHAPE[0] - 1 - HOT[1][0])
        for k, (plane, count) in enumerate((("axial", CT_SHAPE[2]), ("coronal", CT_SHAPE[1]), ("sagittal", 18))):
            box = planes.nth(k)
            assert box.get_attribute("data-slice") == str(starts[k])
            with Image.open(out / "_thumbs" / f"head_gradcam_1-bright.nii_{plane}_slices.jpg") as strip:
                squares = np.asarray(strip.convert("RGB")).reshape(count, 192, 192, 3).astype(np.float64)
            for target in (2, count - 3):
                box.locator("input[type=range]").fill(str(target))  # the value set, and an input event
                assert box.get_attribute("data-slice") == str(target)
                assert box.locator(".p").text_content() == f"{plane} slice {target + 1} of {count}"
                seen = np.asarray(Image.open(io.BytesIO(box.locator(".window").screenshot())).convert("RGB"))
                differences = [np.abs(seen[:192, :192] - square).mean() for square in squares]
                assert int(np.argmin(differences)) == target, (plane, target, differences[target])
                assert differences[target] < 8.0  # JPEG decoded and drawn by the browser
    finally:
        page.close()


def test_serve_shows_a_scans_three_planes_scrolls_them_and_switches_class(browser, tmp_path):
    from clip_outputs import write_manifest

    from gradcam_cli.serve import create_app

    run = tmp_path / "out"
    scan, records = scan_run(run)
    manifest = write_manifest(run / "manifest.jsonl", records)
    server = Running(create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work"))
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        page.locator("#rows-body tr").first.click()
        page.wait_for_selector("#scan-sagittal")
        # through the peak first: each plane the montage's drawing of it
        for plane, axis in (("axial", 2), ("coronal", 1), ("sagittal", 0)):
            src = f"/api/run/rows/0/scan/{plane}/{HOT[1][axis]}.png"
            page.wait_for_function(LOADED, arg=[f"scan-{plane}", src], timeout=60_000)
            torch.testing.assert_close(shown(page, f"scan-{plane}"), expected_slice(scan, 1, plane, HOT[1]))
            assert f"{plane} {'ijk'[axis]}={HOT[1][axis]} " in page.text_content(f"#scan-{plane}-label")
            assert page.text_content(f"#scan-{plane}-label").endswith(", the peak")
        # a slider moved: that plane's slice (sagittal: counted from the left, against CT_AFFINE's x)
        page.fill("#scan-sagittal-slice", "2")
        src = f"/api/run/rows/0/scan/sagittal/{CT_SHAPE[0] - 1 - 2}.png"
        page.wait_for_function(LOADED, arg=["scan-sagittal", src], timeout=60_000)
        moved = (CT_SHAPE[0] - 3, HOT[1][1], HOT[1][2])
        torch.testing.assert_close(shown(page, "scan-sagittal"), expected_slice(scan, 1, "sagittal", moved))
        assert page.text_content("#scan-sagittal-label") == f"sagittal i={CT_SHAPE[0] - 3} (3 of {CT_SHAPE[0]})"
        page.fill("#scan-axial-slice", "7")
        page.wait_for_function(LOADED, arg=["scan-axial", "/api/run/rows/0/scan/axial/7.png"], timeout=60_000)
        torch.testing.assert_close(shown(page, "scan-axial"), expected_slice(scan, 1, "axial", (*HOT[1][:2], 7)))
        # another class: its own map at the slices shown
        options = page.locator("#scan-class option")
        assert [options.nth(k).text_content() for k in range(options.count())] == ["bright (#1)", "dark (#2)"]
        page.select_option("#scan-class", "1")
        page.wait_for_function(LOADED, arg=["scan-axial", "/api/run/rows/1/scan/axial/7.png"], timeout=60_000)
        torch.testing.assert_close(shown(page, "scan-axial"), expected_slice(scan, 2, "axial", (*HOT[2][:2], 7)))
        assert not torch.equal(shown(page, "scan-axial"), expected_slice(scan, 1, "axial", (*HOT[1][:2], 7)))
        page.wait_for_function(LOADED, arg=["scan-coronal", f"/api/run/rows/1/scan/coronal/{HOT[1][1]}.png"])
        assert page.text_content("#status") == ""
    finally:
        page.close()
        server.stop()
