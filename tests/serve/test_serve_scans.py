"""``gradcam serve`` on a run of scans, through Starlette's TestClient (serve/scans.py): a scan's row gives its
planes through the map's peak and its classes; each slice is the montage's drawing of that plane (the same pixels),
another slice or another class another picture; what is not a plane, a slice or a row of the run is refused, and so
is another site's request; a scan moved away leaves the map shown alone."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scan_outputs import HOT, expected_slice, scan_run
from volume_models import CT_AFFINE, CT_SHAPE

pytest.importorskip("starlette")
pytest.importorskip("nibabel")
from starlette.testclient import TestClient

from gradcam_cli.render.montage import LABEL_HEIGHT, MIN_WIDTH, plane_order
from gradcam_cli.serve import create_app

LOCAL = "http://127.0.0.1:8765"


def served(tmp_path: Path) -> tuple[TestClient, Path]:
    from clip_outputs import write_manifest

    run = tmp_path / "out"
    scan, records = scan_run(run)
    manifest = write_manifest(run / "manifest.jsonl", records)
    app = create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work")
    return TestClient(app, base_url=LOCAL), scan


def decoded(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())


@pytest.mark.quick
def test_a_scans_row_gives_its_planes_through_the_peak_and_its_classes(tmp_path):
    client, _ = served(tmp_path)
    with client:
        facts = client.get("/api/run/rows/0/scan").json()
        assert facts["classes"] == [{"row": 0, "index": 1, "name": "bright"}, {"row": 1, "index": 2, "name": "dark"}]
        assert facts["missing"] == ""
        by_plane = {p["plane"]: p for p in facts["planes"]}
        assert list(by_plane) == ["axial", "coronal", "sagittal"]
        for plane, (axis, count) in {"axial": (2, 26), "coronal": (1, 22), "sagittal": (0, 18)}.items():
            assert by_plane[plane]["axis"] == "ijk"[axis] and by_plane[plane]["count"] == count == CT_SHAPE[axis]
            assert by_plane[plane]["peak"] == HOT[1][axis]
        # CT_AFFINE's x runs to the left: its sagittal slices are counted against the voxel index
        assert [by_plane[p]["backwards"] for p in by_plane] == [False, False, True]
        assert plane_order(CT_SHAPE, CT_AFFINE, "sagittal") == (0, 18, True)


def test_each_slice_is_the_montages_drawing_of_that_plane_in_the_runs_window(tmp_path):
    client, scan = served(tmp_path)
    with client:
        for plane in ("axial", "coronal", "sagittal"):
            axis = {"axial": 2, "coronal": 1, "sagittal": 0}[plane]
            through_peak = client.get(f"/api/run/rows/0/scan/{plane}/{HOT[1][axis]}.png")
            assert through_peak.status_code == 200 and through_peak.headers["content-type"] == "image/png"
            torch.testing.assert_close(decoded(through_peak.content), expected_slice(scan, 1, plane, HOT[1]))
            voxel = list(HOT[1])
            voxel[axis] = 3
            moved = decoded(client.get(f"/api/run/rows/0/scan/{plane}/3.png").content)
            torch.testing.assert_close(moved, expected_slice(scan, 1, plane, tuple(voxel)))
            assert not torch.equal(moved, decoded(through_peak.content))
        # the other class's row: its own map, drawn through the same voxel the page asks for
        other = decoded(client.get(f"/api/run/rows/1/scan/axial/{HOT[1][2]}.png").content)
        torch.testing.assert_close(other, expected_slice(scan, 2, "axial", (*HOT[2][:2], HOT[1][2])))
        # the axial slice through the peak is the montage's axial panel, pixel for pixel
        written = np.asarray(Image.open(tmp_path / "out" / "head_gradcam_1-bright_montage.png").convert("RGB"))
        axial = decoded(client.get(f"/api/run/rows/0/scan/axial/{HOT[1][2]}.png").content)
        height, width = axial.shape[:2]
        left = max(0, MIN_WIDTH - width) // 2  # a narrow panel is centred under its label
        panel = torch.from_numpy(written.copy())[LABEL_HEIGHT : LABEL_HEIGHT + height, left : left + width]
        torch.testing.assert_close(panel, axial)
        # the run's colormap by default; another asked for: another picture
        gray = decoded(client.get(f"/api/run/rows/0/scan/axial/{HOT[1][2]}.png?colormap=gray").content)
        assert not torch.equal(gray, axial)


@pytest.mark.quick
def test_what_is_no_plane_slice_or_scan_row_is_refused_and_so_is_another_site(tmp_path):
    client, _ = served(tmp_path)
    with client:
        for url, status in (
            ("/api/run/rows/0/scan/axial/26.png", 404),  # past the last slice
            ("/api/run/rows/0/scan/oblique/0.png", 404),
            ("/api/run/rows/0/scan/..%2f..%2fscans%2fhead.nii.gz/0.png", 404),
            ("/api/run/rows/0/scan/%2e%2e/0.png", 404),
            ("/api/run/rows/0/scan/axial/..%2f0.png", 404),
            ("/api/run/rows/9/scan", 404),
            ("/api/run/rows/0/scan/axial/0.png?alpha=2", 400),
        ):
            answer = client.get(url)
            assert answer.status_code == status, (url, answer.text)
            if answer.headers["content-type"].startswith("application/json"):
                assert "Traceback" not in answer.json()["error"]
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"}):
            assert client.get("/api/run/rows/0/scan/axial/3.png", headers=headers).status_code == 403
            assert client.get("/api/run/rows/0/scan", headers=headers).status_code == 403
        assert client.post("/api/run/rows/0/scan/axial/3.png").status_code == 405


def test_a_scan_moved_away_leaves_its_map_shown_alone_and_an_image_row_has_no_planes(tmp_path):
    client, scan = served(tmp_path)
    scan.unlink()
    with client:
        facts = client.get("/api/run/rows/0/scan").json()
        assert facts["missing"].startswith("the scan cannot be read (") and "shown alone" in facts["missing"]
        assert client.get("/api/run/rows/0/scan/axial/3.png").status_code == 200
    run = tmp_path / "images"
    run.mkdir()
    row = {"input": "a.png", "status": "ok", "method": "gradcam", "outputs": [str(run / "a_gradcam.png")]}
    Image.new("RGB", (4, 4)).save(run / "a_gradcam.png")
    manifest = run / "manifest.jsonl"
    manifest.write_text(json.dumps(row) + "\n")
    app = create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work2")
    with TestClient(app, base_url=LOCAL) as images:
        answer = images.get("/api/run/rows/0/scan")
        assert answer.status_code == 404 and answer.json()["error"] == "this row has no scan's map"
