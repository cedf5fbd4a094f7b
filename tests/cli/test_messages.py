"""What the user reads when something is wrong: labels files checked against the model, weights files that are
not weights, state-dict mismatches, class-name suggestions, and per-image errors without exception class names
or a path named twice."""

from __future__ import annotations

import pickle
import re
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from square_model import square_image
from torch import nn
from typer.testing import CliRunner

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_MODEL, EXIT_USAGE, ModelLoadError, UsageError, describe
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.io.discovery import InputImage
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.labels import read_labels, resolve_target
from gradcam_cli.models.loading import LoadedModel, imagenet_categories, load_model
from gradcam_cli.models.weights import apply_state_dict
from gradcam_cli.options import EvalOptions, OutputOptions

SQUARE = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
CLASS_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Warning)\b")
"""An exception class name, e.g. RuntimeError or UnpicklingError: never part of a message."""


def run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def assert_clean(message: str, path: str | Path) -> None:
    """One line, naming ``path`` exactly once, with no exception class name."""
    assert "\n" not in message and "Traceback" not in message, message
    assert message.count(str(path)) == 1, message
    assert CLASS_NAME.search(message) is None, message


# --- labels files -----------------------------------------------------------------------------------------------


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def test_labels_count_must_match_a_custom_model_found_by_one_forward_pass(tmp_path):
    labels = write(tmp_path / "classes.txt", "red\ngreen\nblue\npurple\n")
    with pytest.raises(UsageError) as caught:
        load_model(SQUARE, labels=labels)
    assert str(caught.value) == f"labels file {labels} has 4 names but the model has 3 classes"
    assert load_model(SQUARE, labels=write(tmp_path / "ok.txt", "red\ngreen\nblue\n")).categories == [
        "red",
        "green",
        "blue",
    ]


@pytest.mark.parametrize(
    ("model", "weights", "num_classes", "classes"),
    [("resnet18", "none", 3, 3), ("resnet18", "none", None, 1000), ("efficientnet_lite0", "none", None, 1000)],
)
def test_labels_count_must_match_a_known_model(tmp_path, model, weights, num_classes, classes):
    labels = write(tmp_path / "two.txt", "cat\ndog\n")
    with pytest.raises(UsageError, match=rf"^labels file \S+two\.txt has 2 names but the model has {classes} classes$"):
        load_model(model, weights, num_classes=num_classes, labels=labels)


def test_labels_byte_order_mark_and_header_line_are_not_class_names(tmp_path):
    bom = write(tmp_path / "bom.txt", b"\xef\xbb\xbfred\r\ngreen\r\nblue\r\n")
    assert read_labels(bom) == ["red", "green", "blue"]
    for header in ("name", "Labels", "CLASS", "class_name", "category", " classes "):
        assert read_labels(write(tmp_path / "h.txt", f"\ufeff{header}\nred\ngreen\nblue\n")) == ["red", "green", "blue"]
    assert read_labels(write(tmp_path / "n.txt", "red\nname\nblue\n")) == ["red", "name", "blue"]  # first line only
    assert load_model(SQUARE, labels=write(tmp_path / "csvish.txt", "Class\nred\ngreen\nblue\n")).categories == [
        "red",
        "green",
        "blue",
    ]


def test_labels_file_that_is_not_utf8_is_one_line_exit_2(tmp_path):
    labels = write(tmp_path / "x.txt", "red\ngreen\nblue\n".encode("utf-16"))
    image = tmp_path / "in.png"
    square_image().save(image)
    result = run(image, "-m", SQUARE, "--labels", labels, "-o", tmp_path / "out", "--workers", "0")
    assert result.exit_code == EXIT_USAGE
    assert error_lines(result) == [
        f"error: labels file {labels} is not UTF-8 text; save it as UTF-8, one class name per line"
    ]
    assert "Traceback" not in result.output


@pytest.mark.quick
def test_labels_count_mismatch_on_the_command_line(tmp_path):
    labels = write(tmp_path / "classes.txt", "a\nb\nc\nd\n")
    image = tmp_path / "in.png"
    square_image().save(image)
    result = run(image, "-m", SQUARE, "--labels", labels, "-o", tmp_path / "out", "--workers", "0")
    assert result.exit_code == EXIT_USAGE
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: labels file {labels} has 4 names but the model has 3 classes"
    ]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


NORMALISED_MODEL = (
    "import torch\n"
    "def build():\n"
    "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.AdaptiveAvgPool2d(1),\n"
    "                               torch.nn.Flatten(), torch.nn.Linear(4, 2))\n"
)
"""BatchNorm in training mode: a forward pass in train mode would change its running statistics."""


def test_counting_classes_leaves_the_model_as_it_was(tmp_path):
    (tmp_path / "normnet.py").write_text(NORMALISED_MODEL, encoding="utf-8")
    loaded = load_model(f"{tmp_path / 'normnet.py'}:build", labels=write(tmp_path / "l.txt", "a\nb\n"))
    norm = loaded.module[1]
    assert loaded.module.training and int(norm.num_batches_tracked) == 0
    assert torch.equal(norm.running_mean, torch.zeros(4))


def test_a_model_that_cannot_take_a_blank_input_is_not_refused_for_its_labels(tmp_path):
    (tmp_path / "picky.py").write_text(
        "import torch\n"
        "class Picky(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if not x.any():\n"
        "            raise ValueError('blank input')\n"
        "        return x.mean((2, 3))\n"
        "def build():\n    return Picky()\n",
        encoding="utf-8",
    )
    loaded = load_model(f"{tmp_path / 'picky.py'}:build", labels=write(tmp_path / "l.txt", "a\nb\nc\nd\n"))
    assert loaded.categories == ["a", "b", "c", "d"]


# --- weights files that are not weights -------------------------------------------------------------------------


def _torch_save_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save({"weight": torch.zeros(64, 64)}, buffer)
    return buffer.getvalue()


def _safetensors_bytes() -> bytes:
    header = b'{"weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    return struct.pack("<Q", len(header)) + header + bytes(8)


def _zip_bytes(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")


GARBAGE = {
    "random.pth": (lambda p: p.write_bytes(bytes(range(256)) * 16), "not in a format PyTorch can load"),
    "archive.pth": (_zip_bytes, "a zip archive but not one written by torch.save"),
    "truncated.pth": (lambda p: p.write_bytes(_torch_save_bytes()[:9000]), "cut short or damaged"),
    "empty.pth": (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    "notes.pth": (lambda p: p.write_text("epoch 3: loss 0.12\n"), "a text file, not PyTorch weights"),
    # safetensors files are read (by their content, whatever their name): these are cut short
    "model.safetensors": (lambda p: p.write_bytes(_safetensors_bytes()[:-4]), "a safetensors file that cannot be"),
    "renamed.bin": (lambda p: p.write_bytes(_safetensors_bytes()[:-4]), "a safetensors file that cannot be read"),
    "pickled.pth": (lambda p: p.write_bytes(pickle.dumps({"w": [1, 2]}, protocol=4)), "plain Python pickle"),
    "object.pth": (lambda p: torch.save({"fc.weight": torch.zeros(2), "x": Path("x")}, p), "pickled pathlib"),
    "tensor.pth": (lambda p: torch.save(torch.zeros(3), p), "holds a single tensor, not a state dict"),
    "numbers.pth": (lambda p: torch.save({"a": 1, "b": torch.zeros(1)}, p), "entry 'a' is an int, not a tensor"),
    "checkpoint.pth": (
        lambda p: torch.save({"epoch": 3, "net": {"fc.weight": torch.zeros(2)}}, p),
        "under 'net': save them with torch.save(checkpoint['net'], PATH)",
    ),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_a_weights_file_that_is_not_weights_says_what_it_is_and_what_to_pass(tmp_path, name):
    make, expected = GARBAGE[name]
    path = tmp_path / name
    make(path)
    with pytest.raises(ModelLoadError) as caught:
        load_model("resnet18", str(path), num_classes=3)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_MODEL
    assert message.startswith(f"weights file {path} ") and expected in message, message
    assert_clean(message, path)
    assert re.search(r"torch\.save|state_dict\(\)|pip install", message), message  # what to pass instead
    assert not re.search(r":\s*\d+$", message), message


def test_missing_or_folder_weights_are_usage_errors(tmp_path):
    for path in (tmp_path / "missing.pth", tmp_path):
        with pytest.raises(UsageError) as caught:
            load_model("resnet18", str(path))
        assert caught.value.exit_code == EXIT_USAGE and "weights file" in str(caught.value)
        assert_clean(str(caught.value), path)


def test_a_text_file_as_weights_on_the_command_line(tmp_path):
    weights = write(tmp_path / "weights.pth", "not weights\n")
    image = tmp_path / "in.png"
    square_image().save(image)
    result = run(image, "-m", "resnet18", "--weights", weights, "-o", tmp_path / "out")
    assert result.exit_code == EXIT_MODEL
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: weights file {weights} is a text file, not PyTorch weights; "
        "pass a file saved with torch.save(model.state_dict(), PATH)"
    ]


# --- state dicts that do not fit --------------------------------------------------------------------------------


def test_size_mismatches_show_the_file_and_model_shapes():
    import torchvision

    state = torchvision.models.resnet18(num_classes=10).state_dict()
    with pytest.raises(ModelLoadError) as caught:
        apply_state_dict(torchvision.models.resnet18(), state, "r10.pth")
    assert str(caught.value) == (
        "weights file r10.pth does not fit the model: 2 size mismatches "
        "(fc.weight: file 10x512 vs model 1000x512, fc.bias: file 10 vs model 1000); check --model and --num-classes"
    )


def test_missing_and_unexpected_keys_show_the_first_few_and_count_the_rest():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)])
    state = {k.replace("2.", "head."): v for k, v in model.state_dict().items()}
    state |= {f"extra{i}": torch.zeros(1) for i in range(5)}
    with pytest.raises(ModelLoadError) as caught:
        apply_state_dict(model, state, "w.pth")
    message = str(caught.value)
    assert "2 missing keys (2.weight, 2.bias)" in message
    assert "7 unexpected keys (head.weight, head.bias, extra0 and 4 more)" in message
    assert "\n" not in message and "Error(s)" not in message


# --- class-name suggestions -------------------------------------------------------------------------------------


@pytest.mark.quick
def test_a_word_suggests_the_classes_that_contain_it():
    model = LoadedModel(nn.Identity(), "m", "none", imagenet_categories(), InputSpec())
    with pytest.raises(UsageError) as caught:
        resolve_target(model, "cat")
    suggested = str(caught.value).split("Did you mean: ")[1].rstrip("?").split(", ")
    assert suggested[:4] == ["tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"]
    assert 4 <= len(suggested) <= 5
    with pytest.raises(UsageError, match=r"Did you mean: golden retriever, Labrador retriever"):
        resolve_target(model, "retriever")


def test_target_cat_on_the_command_line_suggests_cats(tmp_path, sample_dir):
    result = run(sample_dir / "chelsea.jpg", "-m", "efficientnet_lite0", "-t", "cat", "-o", tmp_path / "out")
    assert result.exit_code == EXIT_USAGE
    (line,) = error_lines(result)
    assert line.startswith("error: unknown class 'cat'. Did you mean: tiger cat, Persian cat, Siamese cat")


# --- describe(): exceptions as phrases --------------------------------------------------------------------------


def test_describe_never_gives_a_class_name_and_drops_the_path(tmp_path):
    path = tmp_path / "x.jpg"
    assert describe(RuntimeError("RuntimeError: shapes differ\nmore detail")) == "shapes differ"
    assert describe(MemoryError()) == describe(RuntimeError("CUDA out of memory. Tried")) != ""
    assert "out of memory" in describe(MemoryError())
    assert describe(FileNotFoundError(2, "No such file or directory", str(path)), path) == "no such file or directory"
    assert describe(NotADirectoryError(20, "Not a directory", "/a/b"), "/a/b/c.png") == "not a directory (/a/b)"
    assert describe(ValueError(f"cannot decode '{path}': bad marker"), path) == "cannot decode: bad marker"
    for empty in (AssertionError(), EOFError(), KeyError(), ValueError("")):
        text = describe(empty)
        assert text and CLASS_NAME.search(text) is None and "Error" not in text, text
    assert describe(KeyError("conv1")) == "missing key 'conv1'"
    wrapped = "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback:\n  ...\nValueError: bad pixel"
    assert describe(RuntimeError(wrapped)) == "bad pixel"


# --- per-image errors: each names the image once and no exception class ----------------------------------------


FLAT_MODEL = (
    "import torch\n"
    "def build():\n"
    "    return torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, padding=1), torch.nn.Flatten(),\n"
    "                               torch.nn.Linear(3 * 224 * 224, 3))\n"
)
"""Runs only on 224 x 224 inputs: a photo that is not square fails in the model."""


@pytest.mark.quick
def test_every_per_image_error_names_the_image_once_without_a_class_name(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    good = folder / "good.jpg"
    square_image().save(good)
    whole = good.read_bytes()
    (folder / "truncated.jpg").write_bytes(whole[: len(whole) // 3])
    (folder / "text.jpg").write_text("I am text, not a JPEG\n")
    (tmp_path / "flat.py").write_text(FLAT_MODEL, encoding="utf-8")
    labels = write(tmp_path / "labels.txt", "red\ngreen\nblue\n")
    result = run(folder, "-m", f"{tmp_path / 'flat.py'}:build", "--labels", labels, "-o", tmp_path / "out")
    assert result.exit_code == EXIT_IMAGE_FAILED
    lines = error_lines(result)
    assert len(lines) == 3, result.stderr
    for line in lines:
        assert_clean(line, re.search(r"error: (\S+?): ", line).group(1))
    assert any("the model failed on this image" in line and "good.jpg" in line for line in lines), lines


def test_decode_and_write_failures_name_the_image_once_without_a_class_name(tmp_path, monkeypatch):
    import gradcam_cli.pipeline.decode as decode
    import gradcam_cli.pipeline.outputs as outputs

    image = tmp_path / "in" / "a.png"
    image.parent.mkdir()
    square_image().save(image)
    labels = write(tmp_path / "labels.txt", "red\ngreen\nblue\n")
    args = [image, "-m", SQUARE, "--labels", labels, "-o", tmp_path / "out", "--workers", "0", "--layer", "features"]

    def refuse(*_args, **_kwargs):
        raise ValueError("the encoder refused")

    monkeypatch.setattr(outputs, "save_image", refuse)
    result = run(*args)
    assert result.exit_code == EXIT_IMAGE_FAILED
    (line,) = error_lines(result)
    assert line.startswith(f"error: {image}: cannot write ") and line.endswith(": the encoder refused")
    assert_clean(line, image)

    def broken(*_args, **_kwargs):
        raise RuntimeError(f"RuntimeError: cannot convert {image}")

    monkeypatch.setattr(decode, "to_input_tensor", broken)
    result = run(*args)
    (line,) = error_lines(result)
    assert line == f"error: {image}: cannot read it (cannot convert the file)"


def test_evaluation_failure_names_the_image_once_without_a_class_name(tmp_path):
    (tmp_path / "flat.py").write_text(FLAT_MODEL, encoding="utf-8")
    loaded = load_model(f"{tmp_path / 'flat.py'}:build")
    image = tmp_path / "wide.png"
    square_image().save(image)
    scores = Evaluator(Explainer(loaded, "0"), EvalOptions(steps=2)).evaluate_image(image)
    assert scores.error is not None and scores.error.startswith(f"{image}: cannot evaluate this image (")
    assert_clean(scores.error, image)


def test_video_failure_names_the_clip_once_without_a_class_name(tmp_path, square_model):
    pytest.importorskip("cv2")
    from gradcam_cli.pipeline.video import VideoRunner

    clip = tmp_path / "bad.mp4"
    clip.write_bytes(bytes(1000))
    records = VideoRunner(Explainer(square_model, "features"), OutputOptions(output_dir=tmp_path / "out")).run(
        InputImage(clip, Path("bad"))
    )
    (record,) = records
    assert record.error == f"{clip}: not a video OpenCV can read"


# --- paths as typed: empty, or more than the file system can name -----------------------------------------------


def gradcam(monkeypatch, capsys, *args: str | Path) -> tuple[int, str, str]:
    """The console script's own dispatch (``gradcam eval``, ``diff``, ``merge`` included), in this process."""
    from gradcam_cli import cli

    monkeypatch.setattr("sys.argv", ["gradcam", *map(str, args)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "Errno" not in err and CLASS_NAME.search(err) is None, err
    return lines[0]


EMPTY = {
    "input": ["", "-m", SQUARE],
    "input among others": ["photo.png", "", "-m", SQUARE],
    "-o": ["photo.png", "-m", SQUARE, "-o", ""],
    "--manifest": ["photo.png", "-m", SQUARE, "--manifest", ""],
    "--labels": ["photo.png", "-m", SQUARE, "--labels", ""],
    "--weights": ["photo.png", "-m", "resnet18", "--weights", ""],
    "eval input": ["eval", "", "-m", SQUARE],
    "eval --boxes": ["eval", "photo.png", "-m", SQUARE, "--boxes", ""],
    "eval --plot": ["eval", "photo.png", "-m", SQUARE, "--plot", ""],
    "diff baseline": ["diff", "", "run"],
    "diff current": ["diff", "run", ""],
    "diff --report": ["diff", "run", "run", "--report", ""],
    "merge": ["merge", ""],
}


@pytest.mark.quick
@pytest.mark.parametrize("case", EMPTY)
def test_an_empty_path_is_refused_never_read_as_the_current_folder(tmp_path, monkeypatch, capsys, case):
    """``gradcam "$IMG"`` with IMG unset explained everything below the working folder (Path("") is ".")."""
    monkeypatch.chdir(tmp_path)
    square_image(size=(64, 48), box=(10, 10, 20, 20)).save(tmp_path / "photo.png")
    code, out, err = gradcam(monkeypatch, capsys, *EMPTY[case])
    assert code == EXIT_USAGE, err
    assert "empty" in one_error(err) and "shell variable unset?" in err
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photo.png"]  # nothing explained, nothing created


LONG = "x" * 300  # over the 255-byte limit of a file name on every common file system
TOO_LONG = {
    "-o": ["photo.png", "-m", SQUARE, "-o", f"out/{LONG}"],
    "--manifest": ["photo.png", "-m", SQUARE, "--manifest", f"{LONG}.jsonl"],
    "input": [f"{LONG}.png", "-m", SQUARE],
    "input pattern": [f"{LONG}*.png", "-m", SQUARE],
    "hf: model": ["photo.png", "-m", f"hf:{LONG}"],
    "file.py model": ["photo.png", "-m", f"{LONG}.py:build"],
    "--weights": ["photo.png", "-m", "resnet18", "--weights", f"{LONG}.pth"],
    "--labels": ["photo.png", "-m", SQUARE, "--labels", f"{LONG}.txt"],
    "eval input": ["eval", f"{LONG}.png", "-m", SQUARE],
    "eval --boxes": ["eval", "photo.png", "-m", SQUARE, "--boxes", f"{LONG}.csv"],
    "diff baseline": ["diff", LONG, "base.jsonl"],
    "diff current": ["diff", "base.jsonl", f"{LONG}/manifest.jsonl"],
    "diff --report": ["diff", "base.jsonl", "base.jsonl", "--report", LONG],
    "merge": ["merge", LONG],
}


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=pytest.mark.slow) if case == "hf: model" else case for case in TOO_LONG]
)  # hf: imports transformers (seconds)
def test_a_path_the_file_system_cannot_name_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, case):
    monkeypatch.chdir(tmp_path)
    square_image(size=(64, 48), box=(10, 10, 20, 20)).save(tmp_path / "photo.png")
    (tmp_path / "base.jsonl").write_bytes((Path(__file__).parents[1] / "drift_baseline.jsonl").read_bytes())
    code, _, err = gradcam(monkeypatch, capsys, *TOO_LONG[case])
    assert code == EXIT_USAGE, err
    assert "file name too long" in one_error(err)


def test_the_too_long_message_names_the_path_cut_short_and_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    square_image(size=(64, 48), box=(10, 10, 20, 20)).save(tmp_path / "photo.png")
    code, _, err = gradcam(monkeypatch, capsys, "photo.png", "-m", SQUARE, "-o", tmp_path / LONG / "out")
    assert code == EXIT_USAGE
    assert one_error(err) == (
        f"error: {tmp_path}/{'x' * 20}…{'x' * 10}/out: file name too long (one part of it is 300 bytes; the file "
        "system allows 255)"
    )
    deep = "/".join(["a"] * 2100)  # every part short, the whole over PATH_MAX (4096)
    code, _, err = gradcam(monkeypatch, capsys, "photo.png", "-m", SQUARE, "-o", deep)
    assert code == EXIT_USAGE
    line = one_error(err)
    assert line.endswith("file name too long (the path is 4199 bytes; the limit is 4096)") and len(line) < 300


# --- methods that read no layer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["rise", "occlusion"])
def test_black_box_methods_alone_name_no_empty_layer(tmp_path, method):
    image = tmp_path / "in.png"
    square_image((64, 48), (10, 10, 30, 30)).save(image)
    small = ["--rise-masks", "8", "--occlusion-stride", "32", "--input-size", "64", "--workers", "0"]
    result = run(image, "-m", SQUARE, "--method", method, "-o", tmp_path / "out", *small)
    assert result.exit_code == 0, result.output
    assert "layer " not in result.output, result.output  # neither "using layer  (...)" nor "(model M, layer )"
    assert result.stdout.splitlines()[0] == f"{image}  (model {SQUARE})"
    result = run(image, "-m", SQUARE, "--method", f"{method},gradcam", "-o", tmp_path / "out2", *small)
    assert "using layer features (last spatial layer; choose with --layer)" in result.stderr
    assert result.stdout.splitlines()[0] == f"{image}  (model {SQUARE}, layer features)"


# --- paths named once, and never a temporary file's name ----------------------------------------------------------


@pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "temporary-name"])
def test_an_output_name_too_long_is_named_once_without_the_temporary_file(tmp_path, monkeypatch, unnamed):
    if not unnamed:  # systems without O_TMPFILE, and outputs replacing a file, go through a temporary name
        monkeypatch.setattr("gradcam_cli.io.atomic._unnamed_files", [False])
    image = tmp_path / f"{'L' * 245}.png"  # 249 bytes; its overlay's name, 261, is over the file system's 255
    square_image((64, 48), (10, 10, 30, 30)).save(image)
    square_image((64, 48), (10, 10, 30, 30)).save(tmp_path / "short.png")
    out = tmp_path / "out"
    result = run(image, tmp_path / "short.png", "-m", SQUARE, "-o", out, "--workers", "0")
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    overlay = out / f"{image.stem}_gradcam_0-0.png"
    assert error_lines(result) == [f"error: {image}: cannot write {overlay}: file name too long"]
    assert (out / "short_gradcam_0-0.png").is_file()
    assert not [p for p in out.iterdir() if ".gradcam-tmp-" in p.name]


def test_a_similar_reference_that_is_not_an_image_is_named_once(tmp_path):
    image, reference = tmp_path / "in.png", tmp_path / "t.jpg"
    square_image((64, 48), (10, 10, 30, 30)).save(image)
    reference.write_text("hello\n")
    embed = f"{Path(__file__).parents[1].joinpath('embedding_model.py')}:build"
    for target, reason in [
        (reference, "not an image Pillow can read"),
        (tmp_path / "missing.jpg", "the reference does not exist"),
    ]:
        result = run(image, "-m", embed, "--target", f"similar:{target}", "-o", tmp_path / "out", "--workers", "0")
        assert result.exit_code == EXIT_USAGE, result.output
        assert error_lines(result) == [f"error: similar:{target}: {reason}"]
        assert_clean(error_lines(result)[0], target)
