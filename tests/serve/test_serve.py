"""``gradcam serve``: the API through Starlette's TestClient (maps against the library's, replayed class switches,
parallel requests, run view paging and filtering, path containment, uploads, cross-origin refusals) and the
command itself (a subprocess on 127.0.0.1, stopped with Ctrl-C)."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from gradcam_cli import Explainer
from gradcam_cli.options import ModelOptions, ServeOptions
from gradcam_cli.serve import ModelService, create_app
from gradcam_cli.serve.files import contained
from gradcam_cli.serve.http import HttpError

ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "docs" / "examples" / "two.png"
LABELS = ROOT / "docs" / "examples" / "squares.txt"
LOCAL = "http://127.0.0.1:8765"


def squares(width: int = 64, height: int = 48) -> Image.Image:
    image = Image.new("RGB", (width, height), (0, 0, 255))
    image.paste((255, 0, 0), (4, 4, 24, 24))
    image.paste((0, 255, 0), (34, 20, 60, 44))
    return image


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def unpack(data: bytes) -> np.ndarray:
    """The page's decoding of a packed map PNG: (red * 256 + green) / 65535."""
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float64)
    return (rgb[..., 0] * 256 + rgb[..., 1]) / 65535


@pytest.fixture
def client(square_model, tmp_path):
    service = ModelService(square_model)
    app = create_app(service, work_dir=tmp_path / "work", options=ServeOptions(max_upload_bytes=200_000))
    with TestClient(app, base_url=LOCAL) as test_client:
        yield test_client, service


def upload(client: TestClient, image: Image.Image, name: str = "a.png") -> str:
    answer = client.post(f"/api/upload?name={name}", content=png(image))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


@pytest.mark.quick
def test_maps_match_the_library_and_a_class_switch_runs_no_forward_pass(client, square_model):
    test_client, service = client
    image = squares()
    image_id = upload(test_client, image)
    first = test_client.get(f"/api/map?image={image_id}").json()
    assert first["forward"] is True and first["target"]["name"] == "blue"  # the background is blue
    assert next(p["name"] for p in first["predictions"]) == "blue"
    reference = Explainer(square_model, "features", "gradcam")
    for name, index in (("red", 0), ("GREEN", 1)):
        switched = test_client.get(f"/api/map?image={image_id}&target={name}").json()
        assert switched["forward"] is False and switched["target"]["index"] == index
        sent = unpack(test_client.get(f"/api/maps/{switched['id']}.png").content)
        expected = reference.explain(image, target=index).explanations[0].saliency.numpy()
        assert sent.shape == expected.shape == (48, 64)
        assert np.abs(sent - expected).max() < 1e-4  # 16-bit precision
        npy = np.load(io.BytesIO(test_client.get(f"/api/maps/{switched['id']}/map.npy").content))
        np.testing.assert_allclose(npy, expected, atol=1e-6)
    assert service.passes.forward_passes == 1 and service.passes.replayed_passes == 2
    red = unpack(
        test_client.get(f"/api/maps/{test_client.get(f'/api/map?image={image_id}&target=0').json()['id']}.png").content
    )
    assert red[14, 14] > 0.9 and red[30, 45] < 0.1  # the red square lights up for "red"
    unknown = test_client.get(f"/api/map?image={image_id}&target=purple")
    assert unknown.status_code == 400 and "purple" in unknown.json()["error"]


@pytest.mark.slow
def test_layers_methods_downloads_and_faithfulness(client):
    test_client, _ = client
    info = test_client.get("/api/info").json()
    layers = {layer["name"]: layer for layer in info["model"]["layers"]}
    assert layers["features"]["default"] and layers["features"]["shape"] == [1, 3, 224, 224]
    assert "scorecam" in info["model"]["methods"] and len(info["colormaps"]["jet"]) == 256
    image_id = upload(test_client, squares())
    other = test_client.get(f"/api/map?image={image_id}&layer=features.0&method=layercam&target=red").json()
    assert (other["layer"], other["method"], other["name"]) == ("features.0", "layercam", "a_layercam_0-red")
    overlay = test_client.get(f"/api/maps/{other['id']}/overlay.png?colormap=viridis&alpha=0.3")
    assert overlay.headers["content-disposition"] == 'attachment; filename="a_layercam_0-red.png"'
    assert Image.open(io.BytesIO(overlay.content)).size == (64, 48)
    assert test_client.get(f"/api/maps/{other['id']}/heatmap.png").status_code == 200
    bad = test_client.get(f"/api/maps/{other['id']}/heatmap.png?colormap=virdis")
    assert bad.status_code == 400 and "viridis" in bad.json()["error"]
    figures = test_client.get(f"/api/maps/{other['id']}/faithfulness").json()
    assert 0 <= figures["deletion_auc"] <= 1 and 0 <= figures["insertion_auc"] <= 1 and "road" not in figures
    for url in ("/api/map?image=u0000000000000000", "/api/maps/nope.png", f"/api/map?image={image_id}&layer=fc9"):
        answer = test_client.get(url)
        assert answer.status_code in (400, 404) and "\n" not in answer.json()["error"]
    assert test_client.get("/api/info").status_code == 200  # still serving


@pytest.mark.slow
def test_faithfulness_figures_are_gradcam_evals(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gradcam_cli.cli.eval import app as eval_app

    monkeypatch.chdir(ROOT)
    model = ["--model", "tests/square_model.py:build", "--weights", "none", "--input-size", "16"]
    image = tmp_path / "squares.png"
    squares().save(image)
    service = ModelService(ModelOptions("tests/square_model.py:build", weights="none", input_size=16))
    with TestClient(create_app(service, work_dir=tmp_path / "work"), base_url=LOCAL) as test_client:
        image_id = upload(test_client, squares())
        shown = test_client.get(f"/api/map?image={image_id}&target=1&method=layercam&layer=features.0").json()
        served = test_client.get(f"/api/maps/{shown['id']}/faithfulness?road=1").json()
        wrong_task = test_client.get("/api/maps/nothing/faithfulness")
        assert wrong_task.status_code == 404
    options = ["--target-class", "1", "--method", "layercam", "--layer", "features.0", "--steps", "20", "--road"]
    result = CliRunner().invoke(eval_app, [str(image), *model, *options, "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    expected = json.loads(result.stdout.splitlines()[0])["per_image"][0]["methods"]["layercam"]
    assert served["target"]["index"] == 1 and served["steps"] == 20
    for key in ("deletion_auc", "insertion_auc", "masked_probability", "road"):
        assert served[key] == pytest.approx(expected[key], abs=1e-6), key
    assert served["deletion"] == pytest.approx(expected["deletion_curve"], abs=1e-6)


def test_parallel_requests_agree_with_single_requests(square_model, tmp_path):
    images = [squares(), squares(48, 64).transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    asks = [
        (i, target, method)
        for i in range(2)
        for target in ("red", "green", "blue")
        for method in ("gradcam", "layercam")
    ]
    single = ModelService(square_model)
    with TestClient(create_app(single, work_dir=tmp_path / "a"), base_url=LOCAL) as one:
        ids = [upload(one, image, f"{n}.png") for n, image in enumerate(images)]
        expected = {ask: one.get(f"/api/maps/{one.get(_url(ids, ask)).json()['id']}.png").content for ask in asks}
    parallel = ModelService(square_model)
    with TestClient(create_app(parallel, work_dir=tmp_path / "b"), base_url=LOCAL) as many:
        ids = [upload(many, image, f"{n}.png") for n, image in enumerate(images)]
        barrier = threading.Barrier(6, timeout=60)

        def ask(item: tuple[int, str, str]) -> bytes:
            barrier.wait()
            answer = many.get(_url(ids, item))
            return many.get(f"/api/maps/{answer.json()['id']}.png").content

        with ThreadPoolExecutor(6) as pool:
            got = dict(zip(asks, pool.map(ask, asks), strict=True))
    for item in asks:
        np.testing.assert_allclose(unpack(got[item]), unpack(expected[item]), atol=2e-5, err_msg=str(item))
    assert not any(module._forward_hooks or module._backward_hooks for module in square_model.module.modules())


def _url(ids: list[str], item: tuple[int, str, str]) -> str:
    return f"/api/map?image={ids[item[0]]}&target={item[1]}&method={item[2]}"


@pytest.mark.quick
def test_uploads_are_checked_before_and_while_decoding(square_model, tmp_path):
    service = ModelService(square_model)
    options = ServeOptions(max_upload_bytes=50_000, max_pixels=100_000)
    with TestClient(create_app(service, work_dir=tmp_path, options=options), base_url=LOCAL) as test_client:
        data = png(squares())
        cases = {
            "too large": (os.urandom(60_000), 413),
            "not an image": (b"<html>hello</html>", 415),
            "truncated": (data[: len(data) // 2], 422),
            "bomb": (png(Image.new("L", (2000, 2000))), 413),
            "empty": (b"", 400),
        }
        for what, (body, status) in cases.items():
            answer = test_client.post("/api/upload", content=body)
            assert answer.status_code == status, (what, answer.text)
            assert "\n" not in answer.json()["error"]
        assert test_client.post("/api/upload", content=data).status_code == 200  # still serving


@pytest.mark.quick
def test_a_failing_model_is_an_error_answer_and_the_server_keeps_serving(client, square_model, monkeypatch):
    test_client, _ = client
    image_id = upload(test_client, squares())
    flags = [p.requires_grad for p in square_model.module.parameters()]
    modes = [m.training for m in square_model.module.modules()]

    def broken(_x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the head broke\nsecond line")

    with monkeypatch.context() as patch:
        patch.setattr(square_model.module.fc, "forward", broken)
        failed = test_client.get(f"/api/map?image={image_id}")
    assert failed.status_code == 500 and failed.json() == {"error": "the request failed: the head broke"}
    assert test_client.get(f"/api/map?image={image_id}").status_code == 200
    assert not any(m._forward_hooks or m._backward_hooks for m in square_model.module.modules())
    assert [p.requires_grad for p in square_model.module.parameters()] == flags  # the model as it was found
    assert [m.training for m in square_model.module.modules()] == modes


def test_state_changes_refuse_other_origins(client):
    test_client, _ = client
    data = png(squares())
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        answer = test_client.post("/api/upload", content=data, headers=headers)
        assert answer.status_code == 403 and answer.json() == {"error": "cross-origin requests are refused"}
    same = test_client.post("/api/upload", content=data, headers={"Origin": LOCAL})
    assert same.status_code == 200
    assert test_client.get("/api/upload").status_code == 405
    rebound = test_client.get("/api/info", headers={"Host": "attacker.example:8765"})
    assert rebound.status_code == 403 and "127.0.0.1" in rebound.json()["error"]
    assert test_client.get("/api/info", headers={"Host": "localhost:8765"}).status_code == 200
    assert test_client.get("/api/info", headers={"Host": "[::1]:8765"}).status_code == 200
    page = test_client.get("/")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert ".innerHTML" not in test_client.get("/static/app.js").text  # text is set with textContent only


@pytest.mark.quick
def test_loopback_hosts():
    from gradcam_cli.serve.origin import host_name
    from gradcam_cli.serve.server import is_loopback

    assert [is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "192.168.1.2", "example.com", "::", "")] == [False] * 5
    assert [host_name(h) for h in ("127.0.0.1:80", "[::1]:80", "localhost", "::1")] == [
        "127.0.0.1",
        "::1",
        "localhost",
        "::1",
    ]


def write_run(folder: Path, rows: int, errors_every: int = 7) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for n in range(rows):
        name = f"img{n:06d}.png"
        if n % errors_every == 3:
            lines.append({"input": f"in/{name}", "status": "error", "error": f"in/{name}: not an image", "outputs": []})
            continue
        cls = n % 3
        target = {"index": cls, "name": ["red", "green", "blue"][cls], "probability": (n % 100) / 100}
        lines.append(
            {
                "input": f"in/{name}",
                "status": "ok",
                "error": None,
                "outputs": [f"{folder.name}/{name}"],
                "predictions": [target],
                "target": target,
                "method": "gradcam",
                "layer": "features",
            }
        )
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def test_run_view_pages_filters_sorts_and_follows_the_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "out"
    manifest = write_run(run, 100)
    Image.new("RGB", (8, 8), (255, 0, 0)).save(run / "img000000.png")
    drift = tmp_path / "diff.json"
    drift.write_text(json.dumps({"drifting": ["in/img000001.png"], "pairs": [{"input": "in/img000000.png"}]}))
    app = create_app(None, run_dir=run, manifest=manifest, drift=drift, work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as test_client:
        info = test_client.get("/api/info").json()
        assert info["model"] is None and info["run"]["total"] == 100 and info["run"]["statuses"] == ["error", "ok"]
        page = test_client.get("/api/run/rows?limit=10&offset=20").json()
        assert page["total"] == 100 and [r["row"] for r in page["rows"]] == list(range(20, 30))
        failed = test_client.get("/api/run/rows?status=error&limit=200").json()
        assert failed["total"] == len([n for n in range(100) if n % 7 == 3])
        assert all(r["error"].endswith("not an image") for r in failed["rows"])
        green = test_client.get("/api/run/rows?target=Green&pmin=0.5&pmax=0.9&sort=probability&order=desc").json()
        probabilities = [r["probability"] for r in green["rows"]]
        assert green["rows"] and all(
            r["target_name"] == "green" and 0.5 <= r["probability"] <= 0.9 for r in green["rows"]
        )
        assert probabilities == sorted(probabilities, reverse=True)
        assert [r["drift"] for r in test_client.get("/api/run/rows?drift=drift").json()["rows"]] == ["drift"]
        assert test_client.get("/api/run/rows?sort=input;drop").status_code == 400
        assert test_client.get("/api/run/rows/0/outputs/0").headers["content-type"] == "image/png"
        assert test_client.get("/api/map?image=r0").status_code == 409  # no model: run view only
        again = create_app(None, run_dir=run, manifest=manifest, drift=drift, work_dir=tmp_path / "work2")
        assert again.state.explorer.run.builds == 0  # the index beside the manifest is reused while it is unchanged
        write_run(run, 120)
        assert test_client.get("/api/run/rows").json()["total"] == 120  # rebuilt from the changed manifest
        assert app.state.explorer.run.builds == 2


def test_a_run_row_is_explained_live_with_a_model(square_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "out"
    manifest = write_run(run, 3)
    (tmp_path / "in").mkdir()
    squares().save(tmp_path / "in" / "img000001.png")
    app = create_app(ModelService(square_model), run_dir=run, manifest=manifest, work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as test_client:
        answer = test_client.get("/api/map?image=r1&target=red")
        assert answer.status_code == 200 and answer.json()["name"] == "img000001_gradcam_0-red"
        assert Image.open(io.BytesIO(test_client.get("/api/images/r1.png").content)).size == (64, 48)
        assert test_client.get("/api/map?image=r7").status_code == 404  # no such row


@pytest.mark.quick
def test_only_files_inside_the_run_folder_are_served(tmp_path):
    run = tmp_path / "out"
    manifest = write_run(run, 3)
    (run / "inside.png").write_bytes(png(squares(4, 4)))
    (tmp_path / "secret.txt").write_text("secret")
    (run / "link.txt").symlink_to(tmp_path / "secret.txt")
    with TestClient(
        create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work"), base_url=LOCAL
    ) as test_client:
        assert test_client.get("/files/inside.png").status_code == 200
        for url in (
            "/files/%2e%2e/secret.txt",
            "/files/..%2fsecret.txt",
            "/files/%252e%252e/secret.txt",
            f"/files/{tmp_path}/secret.txt",
            "/files/link.txt",
            "/files/%2fetc%2fpasswd",
            "/files/inside.png%00",
        ):
            answer = test_client.get(url)
            assert answer.status_code == 404 and "secret" not in answer.text, url
    for bad in ("../secret.txt", "/etc/passwd", "a/../../secret.txt", "link.txt", "..\\secret.txt"):
        with pytest.raises(HttpError):
            contained(run, bad)
    assert contained(run, "inside.png") == (run / "inside.png").resolve()


@pytest.mark.slow
def test_detector_and_segmenter(tmp_path):
    for factory, task in (("build_detector", "detect"), ("build_segmenter", "segment")):
        options = ModelOptions(f"{ROOT}/tests/task_models.py:{factory}", labels=LABELS)
        from gradcam_cli.io.discovery import discover

        service = ModelService(options)
        with TestClient(create_app(service, discover([TWO]), work_dir=tmp_path / task), base_url=LOCAL) as test_client:
            assert test_client.get("/api/images").json()["images"][0]["id"] == "i0"
            combined = test_client.get("/api/map?image=i0").json()
            if task == "detect":
                assert combined["rank"] == 0 and [p["name"] for p in combined["predictions"]] == ["red", "green"]
                second = test_client.get("/api/map?image=i0&rank=2").json()
                assert second["rank"] == 2 and second["target"]["name"] == "green" and second["forward"] is False
                assert second["target"]["box"] == [40.0, 50.0, 100.0, 110.0]
            else:
                shares = {p["name"]: p["share"] for p in combined["predictions"]}
                assert shares["__background__"] > 0.8 and 0.03 < shares["red"] < 0.06
                red = test_client.get("/api/map?image=i0&target=red").json()
                assert red["target"]["name"] == "red" and red["forward"] is False


@pytest.mark.slow
def test_the_command_prints_its_url_serves_and_exits_130_on_ctrl_c(tmp_path):
    run = tmp_path / "out"
    write_run(run, 5)
    (run / ".gradcam-run.json").write_text(json.dumps({"layers": "features.0", "colormap": "viridis", "alpha": 0.3}))
    model = ["--model", str(ROOT / "tests" / "square_model.py:build"), "--weights", "none"]
    command = [sys.executable, "-m", "gradcam_cli", "serve", str(run), *model, "--port", "0", "--host", "localhost"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 120)  # a hang guard, never a timing
        line = process.stdout.readline() if ready else ""
        assert line.startswith("serving on http://127.0.0.1:"), line
        url = line.split()[2]
        import httpx

        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url + "api/run/rows", timeout=30).json()["total"] == 5
        info = httpx.get(url + "api/info", timeout=30).json()
        assert info["model"]["default_layer"] == "features.0"  # the run record's settings are the defaults
        assert (info["colormap"], info["alpha"]) == ("viridis", 0.3)
        image = httpx.get(url + "api/images/r0.png", timeout=30)
        assert image.status_code == 422  # the row's input does not exist here: an answer, not a crash
        upload = httpx.post(url + "api/upload", content=png(squares()), timeout=30).json()
        assert httpx.get(url + f"api/map?image={upload['id']}", timeout=60).json()["layer"] == "features.0"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert process.stderr and process.stderr.read().strip().splitlines()[-1] == "error: interrupted"
    finally:
        process.kill()
        process.wait()


def test_another_host_is_warned_of_once_bound(tmp_path):
    from typer.testing import CliRunner

    from gradcam_cli.cli.serve import app

    run = tmp_path / "out"
    write_run(run, 2)
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: binding fails first, and nothing claims to listen
    result = CliRunner().invoke(app, [str(run), "--host", "192.0.2.1", "--port", "0"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: cannot listen on 192.0.2.1:0")
    # bound on every address: the warning, then (here) the model that cannot load; nothing is served
    missing = str(tmp_path / "nothing.py") + ":build"
    result = CliRunner().invoke(app, [str(run), "--host", "0.0.0.0", "--port", "0", "--model", missing])
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("warning: listening on 0.0.0.0: anyone who can reach"), result.output
    assert result.exit_code == 2 and "nothing.py" in lines[-1] and "serving on" not in result.output


def test_without_the_extra_one_line_says_so(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gradcam_cli.cli.serve import app

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed: importing it raises ImportError
    result = CliRunner().invoke(app, [str(tmp_path)])
    assert result.exit_code == 2
    assert result.output == "error: gradcam serve needs the optional extra: pip install 'gradcam-cli[serve]'\n"


def test_a_missing_path_is_a_usage_error(tmp_path):
    from typer.testing import CliRunner

    from gradcam_cli.cli.serve import app

    result = CliRunner().invoke(app, [str(tmp_path / "nothing.png"), "--model", "x.py:build"])
    assert result.exit_code == 2 and result.output.startswith("error: ") and "no such file" in result.output
    assert torch.is_grad_enabled()


def test_every_route_that_computes_refuses_other_sites_and_passes_are_bounded(square_model, tmp_path):
    service = ModelService(square_model)
    bounded = create_app(service, work_dir=tmp_path / "a", options=ServeOptions(request_seconds=0))
    with TestClient(bounded, base_url=LOCAL) as test_client:
        image_id = upload(test_client, squares())
        shown = test_client.get(f"/api/map?image={image_id}&target=red").json()
        urls = [
            f"/api/map?image={image_id}&method=scorecam",
            f"/api/maps/{shown['id']}/faithfulness?road=1",
            f"/api/maps/{shown['id']}.png",
            f"/api/images/{image_id}.png",
            "/api/info",
        ]
        for url in urls:
            for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"}):
                answer = test_client.get(url, headers=headers)
                assert answer.status_code == 403, (url, headers)
        assert test_client.get("/", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200  # a link to the page
        same = {"Sec-Fetch-Site": "same-origin", "Origin": LOCAL}
        assert test_client.get(f"/api/maps/{shown['id']}.png", headers=same).status_code == 200
        assert test_client.get("/api/info", headers={"Sec-Fetch-Site": "none"}).status_code == 200
        stopped = test_client.get(f"/api/map?image={image_id}&target=green&method=scorecam", headers=same)
        assert stopped.status_code == 503 and stopped.json()["error"].startswith("stopped after 0 s (0 of ")
        assert test_client.get(f"/api/map?image={image_id}&target=green").status_code == 200  # still serving
    assert not any(m._forward_hooks or m._backward_hooks for m in square_model.module.modules())
    with TestClient(create_app(ModelService(square_model), work_dir=tmp_path / "b"), base_url=LOCAL) as test_client:
        image_id = upload(test_client, squares())
        assert test_client.get(f"/api/map?image={image_id}").json()["forward"] is True
        assert test_client.get(f"/api/map?image={image_id}&target=red").json()["forward"] is False  # replayed
        scorecam = test_client.get(f"/api/map?image={image_id}&target=red&method=scorecam").json()
        assert scorecam["forward"] is True  # its masked inputs ran the model: the page does not say "no forward pass"


def test_uploads_and_filters_say_what_the_user_gave(client, tmp_path):
    test_client, _ = client
    data = png(squares())
    first = test_client.post("/api/upload?name=first.png", content=data).json()
    again = test_client.post("/api/upload?name=second.png", content=data).json()
    assert again["id"] == first["id"] and again["name"] == "second.png"
    listed = test_client.get(f"/api/map?image={again['id']}").json()
    assert listed["name"].startswith("second_")
    other = test_client.post("/api/upload?name=%E7%8C%AB.png", content=png(squares(32, 24))).json()  # 猫.png
    shown = test_client.get(f"/api/map?image={other['id']}").json()
    overlay = test_client.get(f"/api/maps/{shown['id']}/overlay.png")
    assert overlay.status_code == 200
    disposition = overlay.headers["content-disposition"]
    assert disposition.startswith('attachment; filename="_') and "filename*=UTF-8''%E7%8C%AB_gradcam_" in disposition
    run = tmp_path / "out"
    manifest = write_run(run, 5)
    app = create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as runs:
        answer = runs.get("/api/run/rows?pmin=50")
        assert answer.status_code == 400 and "pmin" not in answer.json()["error"]
        assert answer.json()["error"] == "the lowest probability (a fraction): 50 is not between 0 and 1"


def test_a_port_in_use_is_said_before_the_model_loads(tmp_path):
    from typer.testing import CliRunner

    from gradcam_cli.cli.serve import app
    from gradcam_cli.serve.server import bind

    squares().save(tmp_path / "a.png")
    taken = bind("127.0.0.1", 0)
    try:
        port = str(taken.getsockname()[1])
        missing = str(tmp_path / "nothing.py") + ":build"  # never loaded: the port is refused first
        result = CliRunner().invoke(app, [str(tmp_path / "a.png"), "--port", port, "--model", missing])
    finally:
        taken.close()
    assert result.exit_code == 2
    assert result.output == f"error: cannot listen on 127.0.0.1:{port}: address already in use\n"


def test_the_attention_methods_are_offered_only_for_a_model_with_attention(square_model, tmp_path):
    """A CNN's method list leaves out rollout, attn-grad, attention and legrad (choosing one is a 400 naming no
    traceback); a ViT's lists them and serves their maps at the image's size."""
    attention = ("rollout", "attn-grad", "attention", "legrad")
    cnn = ModelService(square_model)
    assert "gradcam" in cnn.methods and not set(attention) & set(cnn.methods)
    vit = ModelService(ModelOptions(str(ROOT / "tests" / "attention_models.py") + ":build_vit", input_size=32))
    assert set(attention) <= set(vit.methods)
    for service, method, status in ((cnn, "rollout", 400), (vit, "rollout", 200), (vit, "attn-grad", 200)):
        app = create_app(service, work_dir=tmp_path / f"work-{id(service)}", options=ServeOptions())
        with TestClient(app, base_url=LOCAL) as test_client:
            assert (method in test_client.get("/api/info").json()["model"]["methods"]) is (status == 200)
            image_id = upload(test_client, squares(64, 32))  # 64 x 32 at --input-size 32: an 8 x 4 patch grid
            answer = test_client.get(f"/api/map?image={image_id}&method={method}&target=1")
            assert answer.status_code == status, answer.text
            if status == 400:
                assert "unknown method 'rollout'" in answer.json()["error"]
            else:
                heatmap = test_client.get(f"/api/maps/{answer.json()['id']}/heatmap.png")
                assert Image.open(io.BytesIO(heatmap.content)).size == (64, 32)


def test_one_dry_pass_serves_every_layer_method_target_and_faithfulness(square_model, tmp_path, monkeypatch):
    import gradcam_cli.cam.layers as layers

    passes: list[str] = []
    real = layers.dry_pass

    def counted(model, device, example=None, tokens=True):
        passes.append(model.name)
        return real(model, device, example, tokens)

    monkeypatch.setattr(layers, "dry_pass", counted)
    service = ModelService(square_model)
    with TestClient(create_app(service, work_dir=tmp_path / "work"), base_url="http://127.0.0.1") as test_client:
        image_id = upload(test_client, squares())
        for query in ("", "&layer=features.0&method=layercam", "&method=gradcam%2B%2B&target=green"):
            made = test_client.get(f"/api/map?image={image_id}{query}").json()
        assert test_client.get(f"/api/maps/{made['id']}/faithfulness").status_code == 200
    assert passes == ["colour-detector"]  # made once, when the service started


@pytest.mark.quick
def test_a_clip_rows_frames_are_served_from_its_overlay_video_inside_the_run_only(tmp_path):
    """``/api/run/rows/<n>/frames``: the overlay video's frame count and rate; ``.../frames/<f>.jpg``: its frame
    f (the colour written there); a frame it lacks, a row without a video, and a video outside the run folder
    (by an absolute path, by ``..``, by a symbolic link): 404; another site's request: 403."""
    from clip_outputs import FPS, FRAMES, clip_records, frame_colour, write_manifest, write_video

    from gradcam_cli.cam.records import Record

    run = tmp_path / "out"
    rows = clip_records(run)
    outside = write_video(tmp_path / "elsewhere" / "secret.mp4")
    (run / "link.mp4").symlink_to(outside)
    for video in (str(outside), str(run / ".." / "elsewhere" / "secret.mp4"), str(run / "link.mp4")):
        rows.append(Record("other.mp4", "ok", "m", "layer4", "gradcam", outputs=[video]))
    rows.append(Record("still.png", "ok", "m", "layer4", "gradcam", outputs=[rows[0].outputs[1]]))
    manifest = write_manifest(run / "manifest.jsonl", rows)
    with TestClient(
        create_app(None, run_dir=run, manifest=manifest, work_dir=tmp_path / "work"), base_url=LOCAL
    ) as test_client:
        facts = test_client.get("/api/run/rows/1/frames")
        assert facts.status_code == 200
        assert facts.json() == {"frames": FRAMES, "fps": FPS, "width": 48, "height": 32}
        for index in (0, 3, FRAMES - 1):
            answer = test_client.get(f"/api/run/rows/0/frames/{index}.jpg")
            assert answer.status_code == 200 and answer.headers["content-type"] == "image/jpeg"
            pixels = np.asarray(Image.open(io.BytesIO(answer.content)).convert("RGB"), dtype=np.float64)
            assert pixels.shape == (32, 48, 3)
            assert np.abs(pixels.mean(axis=(0, 1)) - frame_colour(index)).max() < 12, index
        assert test_client.get(f"/api/run/rows/0/frames/{FRAMES}.jpg").status_code == 404
        for row in (2, 3, 4):  # the video outside the run folder is never decoded
            for url in (f"/api/run/rows/{row}/frames", f"/api/run/rows/{row}/frames/0.jpg"):
                answer = test_client.get(url)
                assert answer.status_code == 404 and answer.json()["error"] == "no such file in the served folder"
        assert test_client.get("/api/run/rows/5/frames").json()["error"] == "this row has no overlay video"
        assert test_client.get("/api/run/rows/9/frames/0.jpg").status_code == 404
        assert test_client.get("/api/run/rows/0/frames/-1.jpg").status_code == 404  # no route
        other_site = test_client.get("/api/run/rows/0/frames/0.jpg", headers={"Sec-Fetch-Site": "cross-site"})
        assert other_site.status_code == 403
        assert test_client.get("/api/run/rows/0/frames", headers={"Origin": "http://evil.test"}).status_code == 403
