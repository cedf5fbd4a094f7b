"""The GPU path: ``--precision`` (autocast for the forward pass, maps in float32), batches halved when the device runs
out of memory, and pinned memory with non-blocking copies.

Tests marked ``gpu`` need CUDA and are skipped without it. The logic is tested on the CPU as well: autocast works
there (bfloat16), running out of memory is faked, and the pinned-memory helpers are plain on the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.results import Explanation, ImageExplanation, Prediction
from gradcam_cli.cli import app
from gradcam_cli.cli.reporting import run_app
from gradcam_cli.io.discovery import discover
from gradcam_cli.io.naming import RUN_RECORD_NAME
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.batch import BatchRunner
from gradcam_cli.pipeline.gpu import is_out_of_memory, results_to_host, stack_inputs

ROOT = Path(__file__).resolve().parents[2]
SQUARE_MODEL = f"{ROOT / 'tests' / 'square_model.py'}:build"
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU on this machine")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """Eight square images and four wide ones (two shapes, so two kinds of batches), and a labels file."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(12):
        size = (96, 96) if i < 8 else (144, 96)
        square_image(size, (10 + i, 10, 40 + i, 40), ["red", "green", "blue"][i % 3]).save(folder / f"p{i:02d}.png")
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    return folder


def gradcam(photos: Path, *more: str | Path):
    args = [photos, "-m", SQUARE_MODEL, "--labels", photos.parent / "labels.txt", "--workers", "0", *more]
    return CliRunner().invoke(app, [str(a) for a in args])


def layer_dtypes(explainer: Explainer, image) -> tuple[list[torch.dtype], ImageExplanation]:
    """The dtypes the explained layer's output had during ``explain``, and the result."""
    seen: list[torch.dtype] = []
    layer = explainer.model.module.features
    handle = layer.register_forward_hook(lambda _m, _i, output: seen.append(output.dtype))
    try:
        return seen, explainer.explain(image)
    finally:
        handle.remove()


# --------------------------------------------------------------------------------------------------- precision


def test_bf16_runs_the_forward_pass_under_autocast_and_makes_float32_maps(square_model):
    image = square_image((160, 120), (20, 20, 60, 60), "green")
    seen32, full = layer_dtypes(Explainer(square_model, "features"), image)
    seen16, half = layer_dtypes(Explainer(square_model, "features", precision="bf16"), image)
    assert seen32 == [torch.float32] and seen16 == [torch.bfloat16]  # autocast really ran the layer in bfloat16
    assert half.predictions[0].name == full.predictions[0].name == "green"
    for low, high in zip(half.explanations, full.explanations, strict=True):
        assert low.saliency.dtype == torch.float32 and low.saliency.shape == high.saliency.shape
        correlation = np.corrcoef(low.saliency.flatten().numpy(), high.saliency.flatten().numpy())[0, 1]
        assert correlation > 0.99
    assert isinstance(half.predictions[0].probability, float)


def test_only_half_precision_outputs_are_turned_into_float32():
    from collections import namedtuple

    from gradcam_cli.cam.precision import full_precision

    Outputs = namedtuple("Outputs", "logits aux")
    half, double = torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.float64)
    out = full_precision(
        Outputs(half, [{"scores": torch.ones(1, dtype=torch.float16), "labels": torch.ones(1).long()}])
    )
    assert isinstance(out, Outputs) and out.logits.dtype == torch.float32
    assert out.aux[0]["scores"].dtype == torch.float32 and out.aux[0]["labels"].dtype == torch.int64
    assert full_precision(double) is double  # a float64 model keeps its precision


def test_precision_is_recorded_and_a_resumed_run_may_not_change_it(photos, tmp_path):
    out = tmp_path / "out"
    result = gradcam(photos, "-o", out, "--precision", "bf16", "--save-raw", "--manifest", out / "m.jsonl")
    assert result.exit_code == 0, result.output
    assert json.loads((out / RUN_RECORD_NAME).read_text())["precision"] == "bf16"
    rows = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    assert {row["provenance"]["precision"] for row in rows} == {"bf16"}
    assert {np.load(path).dtype for path in out.glob("*.npy")} == {np.dtype("float32")}
    again = gradcam(photos, "-o", out, "--skip-existing")
    assert again.exit_code == 2
    assert "--precision bf16 (this run: fp32)" in again.stderr


def test_an_unknown_precision_is_one_line(photos, capsys):
    with pytest.raises(SystemExit) as exit:
        run_app(app, "gradcam", [str(photos), "--precision", "fp8"])
    assert exit.value.code == 2
    assert capsys.readouterr().err == (
        "error: Invalid value for '--precision': 'fp8': use fp32, bf16, fp16 (see gradcam --help)\n"
    )


# ------------------------------------------------------------------------------------------------ out of memory


def out_of_memory() -> BaseException:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total)")


def test_a_batch_that_runs_out_of_memory_is_halved_and_retried_and_that_is_said_once(photos, tmp_path, monkeypatch):
    real = Explainer.explain_batch
    sizes: list[int] = []
    refused: list[str] = []  # a batch the model refused in channels-last, retried contiguous by the batcher

    def explain_batch(self, inputs, sizes_=None, *args):
        if inputs.shape[0] > 2:
            sizes.append(inputs.shape[0])
            raise out_of_memory()
        try:
            result = real(self, inputs, sizes_, *args)
        except Exception as error:
            refused.append(repr(error))
            raise
        sizes.append(inputs.shape[0])
        return result

    monkeypatch.setattr(Explainer, "explain_batch", explain_batch)
    out = tmp_path / "out"
    result = gradcam(photos, "-o", out, "--batch-size", "8", "--save-raw")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: out of memory with 8 images per batch; going on with 4 per batch"]
    # 8 square images: 8 fails, 4 fails, then pairs; the 4 wide ones come in pairs at once, without failing again
    assert sizes == [8, 4, 2, 2, 2, 2, 2, 2], refused
    assert len(list(out.glob("*.png"))) == 12
    monkeypatch.setattr(Explainer, "explain_batch", real)
    plain = tmp_path / "plain"
    assert gradcam(photos, "-o", plain, "--batch-size", "8", "--save-raw").exit_code == 0
    for path in plain.glob("*.npy"):  # halving changes no map
        np.testing.assert_allclose(np.load(out / path.name), np.load(path), atol=1e-5)


def test_an_image_that_runs_out_of_memory_alone_is_an_error_row_and_the_others_go_on(photos, tmp_path, square_model):
    explainer = Explainer(square_model, "features")
    real = explainer.explain_batch

    def explain_batch(inputs, sizes=None, *args):
        if inputs.shape[-1] > inputs.shape[-2]:  # the wide images never fit
            raise out_of_memory()
        return real(inputs, sizes, *args)

    explainer.explain_batch = explain_batch  # type: ignore[method-assign]
    notes: list[str] = []
    runner = BatchRunner(
        explainer, OutputOptions(tmp_path / "out"), RunOptions(batch_size=4, workers=0), notify=notes.append
    )
    records = list(runner.run(discover([photos])))
    assert [record.status for record in records] == ["ok"] * 8 + ["error"] * 4
    assert records[8].error == (
        f"{photos / 'p08.png'}: the model failed on this image (out of memory (try a smaller --batch-size or "
        "--max-side))"
    )
    assert notes == ["warning: out of memory with 4 images per batch; going on with 2 per batch"]


def test_only_out_of_memory_errors_halve_batches():
    assert is_out_of_memory(out_of_memory())
    assert is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not is_out_of_memory(RuntimeError("Given groups=1, weight of size [3, 3, 3, 3], expected input"))
    assert not is_out_of_memory(ValueError("out of memory"))


# ---------------------------------------------------------------------------------------------- pinned memory


def test_on_the_cpu_batches_and_maps_stay_as_they_are():
    tensors = [torch.rand(3, 8, 10) for _ in range(3)]
    batch = stack_inputs(tensors, torch.device("cpu"))
    assert torch.equal(batch, torch.stack(tensors)) and batch.device.type == "cpu"
    saliency = torch.rand(8, 10)
    result = ImageExplanation([], [Explanation("gradcam", Prediction(0, "red", 1.0), saliency)])
    results_to_host([result])
    assert result.explanations[0].saliency is saliency


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_batches_go_through_pinned_memory_and_maps_come_back_pinned():
    tensors = [torch.rand(3, 8, 10) for _ in range(3)]
    batch = stack_inputs(tensors, torch.device("cuda"))
    assert batch.is_cuda and torch.equal(batch.cpu(), torch.stack(tensors))
    saliency = torch.rand(8, 10, device="cuda")
    region = torch.rand(8, 10, device="cuda") > 0.5
    result = ImageExplanation([], [Explanation("gradcam", Prediction(0, "red", 1.0), saliency, region=region)])
    results_to_host([result])
    moved = result.explanations[0]
    assert moved.saliency.device.type == "cpu" and moved.saliency.is_pinned()
    assert torch.equal(moved.saliency, saliency.cpu()) and torch.equal(moved.region, region.cpu())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_cuda_run_makes_the_cpu_runs_maps(photos, tmp_path, precision):
    cpu, cuda = tmp_path / "cpu", tmp_path / "cuda"
    assert gradcam(photos, "-o", cpu, "--save-raw", "--device", "cpu").exit_code == 0
    result = gradcam(photos, "-o", cuda, "--save-raw", "--device", "cuda", "--precision", precision)
    assert result.exit_code == 0, result.output
    for path in sorted(cpu.glob("*.npy")):
        theirs, mine = np.load(path), np.load(cuda / path.name)
        assert mine.dtype == np.float32
        if precision == "fp32":
            np.testing.assert_allclose(mine, theirs, atol=1e-4)
        else:
            assert np.corrcoef(mine.ravel(), theirs.ravel())[0, 1] > 0.99
