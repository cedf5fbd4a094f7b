"""The documentation holds together: the README stays a short guide, every relative link and anchor in README.md
and docs/ resolves, every page is reachable from the README, and every command-line option is documented."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import typer
from conftest import ROOT

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_LIMIT = 15_000

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks, where '#' lines and '[x](y)' are not Markdown."""
    return FENCE.sub("", text)


def anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to '-', repeats numbered."""
    found: set[str] = set()
    for heading in HEADING.findall(_prose(text)):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", plain.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def links(text: str) -> list[str]:
    return [target for target in LINK.findall(_prose(text)) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file, or whose anchor in a Markdown file, does not exist."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and destination.suffix == ".md":
            if anchor not in anchors(destination.read_text(encoding="utf-8")):
                broken.append(f"{target} (no such heading in {destination.name})")
        elif anchor:
            broken.append(f"{target} (anchor into a file that is not Markdown)")
    return broken


@pytest.mark.quick
def test_readme_is_a_short_guide_without_scaffolding() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(README.read_bytes()) < README_LIMIT
    assert "<!--" not in text
    assert not re.search(r"\b(TODO|FIXME|TBD|XXX)\b", text)


def test_anchor_slugs_follow_github() -> None:
    text = "# The `gradcam` command\n## Errors and messages\n```sh\n# not a heading\n```\n## Cost\n## Cost\n"
    assert anchors(text) == {"the-gradcam-command", "errors-and-messages", "cost", "cost-1"}


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda page: page.name)
def test_relative_links_resolve(page: Path) -> None:
    assert links(page.read_text(encoding="utf-8")), f"{page.name} links nowhere"
    assert broken_links(page) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Present\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#present) [b](other.md#absent) [c](missing.md) [d](#here)\n# Here\n")
    assert broken_links(page) == ["other.md#absent (no such heading in other.md)", "missing.md (no such file)"]


@pytest.mark.quick
def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README.read_text(encoding="utf-8"))}
    assert [page.name for page in PAGES if page.resolve() not in linked] == []


def _options(app: typer.Typer) -> list[str]:
    command = typer.main.get_command(app)
    return [max(param.opts, key=len) for param in command.params if param.opts[0].startswith("-")]


@pytest.mark.parametrize(
    ("module", "page"),
    [("explain", "cli.md"), ("eval", "evaluation.md"), ("diff", "ci.md"), ("merge", "scale.md"), ("serve", "serve.md")],
    ids=["gradcam", "gradcam eval", "gradcam diff", "gradcam merge", "gradcam serve"],
)
def test_every_option_is_documented(module: str, page: str) -> None:
    import importlib

    app = importlib.import_module(f"gradcam_cli.cli.{module}").app
    documented = (ROOT / "docs" / page).read_text(encoding="utf-8") + (ROOT / "docs" / "cli.md").read_text()
    missing = [
        option for option in _options(app) if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", documented)
    ]
    assert missing == []


def readme_examples() -> list[tuple[str, list[str]]]:
    """The README's console examples that run from a fresh clone (on ``docs/examples/``): each command and the
    stdout lines shown under it."""
    examples: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                examples.append((line[2:], []))
            elif examples:
                examples[-1][1].append(line)
    return [(command, shown) for command, shown in examples if command.startswith("gradcam docs/examples/")]


@pytest.mark.slow
def test_the_readme_detector_and_segmenter_examples_run_from_a_clone_as_shown(tmp_path, monkeypatch) -> None:
    """Their inputs are committed (docs/examples/), and the command prints exactly the lines the README shows: the
    layer chosen (stderr, which a terminal shows first), then the results (stdout)."""
    import shlex

    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    examples = readme_examples()
    assert [shlex.split(command)[3] for command, _ in examples] == [
        "tests/task_models.py:build_detector",
        "tests/task_models.py:build_segmenter",
    ]
    for folder in ("docs", "tests"):  # the repository's paths, so that gradcam_out/ is written in tmp_path
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    for command, shown in examples:
        result = CliRunner().invoke(app, [*shlex.split(command)[1:], "--workers", "0"])
        assert result.exit_code == 0, result.output
        assert [*result.stderr.splitlines(), *result.stdout.splitlines()] == shown, command
        for line in shown:
            if " -> " in line:
                assert (tmp_path / line.split(" -> ")[1]).is_file()


@pytest.mark.quick
def test_the_method_table_is_the_registrys() -> None:
    """docs/methods.md's table of methods is what the registrations say (regenerate it with
    ``methods_table(BUILTIN_METHODS)``), and docs/cli.md's unknown ``--method`` example is the parser's message."""
    from gradcam_cli.cam.methods import BUILTIN_METHODS
    from gradcam_cli.cam.methods.table import methods_table
    from gradcam_cli.cli.params import unknown_method
    from gradcam_cli.options import METHOD_NAMES

    assert methods_table(BUILTIN_METHODS) in (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    message = f"error: Invalid value for '--method': {unknown_method('foo', METHOD_NAMES)} (see gradcam --help)"
    assert message in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").splitlines()


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.mark.slow  # trains the tiny YOLO (about 30 s on a busy machine)
def test_the_readme_yolo_example_runs_on_what_make_yolo_example_makes(tmp_path, monkeypatch) -> None:
    """``make yolo-example`` runs tests/yolo_model.py, which makes squares.pt and wide.png offline; the README's YOLO
    command then prints the lines shown, to training's float rounding (probabilities within 10 points, boxes within
    3 pixels: the model is trained on whatever CPU runs it, and its confidence in the blue square is 87.0% on one
    machine, 92.7% on another with the same packages)."""
    import shlex
    import subprocess
    import sys

    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    pytest.importorskip("ultralytics")
    recipe = re.search(r"^yolo-example:.*\n\t(.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert recipe is not None and recipe[1] == "$(BIN)/python tests/yolo_model.py ."
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    made = subprocess.run([sys.executable, str(ROOT / "tests" / "yolo_model.py"), "."], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "squares.pt").is_file() and (tmp_path / "wide.png").is_file()
    block = re.search(r"^```console\n\$ pip install -e '\.\[yolo\]'.*?\n(.*?)^```", README.read_text(), re.M | re.S)
    assert block is not None
    command, *shown = block[1].splitlines()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*shlex.split(command.removeprefix("$ "))[1:], "--workers", "0"])
    assert result.exit_code == 0, result.output
    printed = [*result.stderr.splitlines(), *result.stdout.splitlines()]
    assert [NUMBER.sub("N", line) for line in printed] == [NUMBER.sub("N", line) for line in shown]
    for got, expected in zip(printed, shown, strict=True):
        for a, b in zip(map(float, NUMBER.findall(got)), map(float, NUMBER.findall(expected)), strict=True):
            assert abs(a - b) <= (10.0 if "%" in expected else 3.0), (got, expected)


@pytest.mark.slow  # imports MONAI and explains a scan (about 10 s alone; minutes on a loaded machine)
def test_the_volumes_worked_example_command_writes_the_montage_shown(tmp_path, monkeypatch) -> None:
    """docs/volumes.md's worked example runs as written on nibabel's anatomical.nii (``$DATA`` its test data folder)
    and writes the montage whose picture the page shows (docs/volume_montage.png: another run's of the same command;
    not compared byte for byte)."""
    import shlex

    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    pytest.importorskip("monai")
    testing = pytest.importorskip("nibabel.testing")
    page = (ROOT / "docs" / "volumes.md").read_text(encoding="utf-8")
    section = page.split("## Worked example", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```console\n(.*?)^```", section, re.M | re.S)
    assert block is not None
    setting, command = block[1].splitlines()
    assert setting == "$ DATA=$(python -c 'from nibabel.testing import data_path; print(data_path)')"
    picture = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", section)
    assert picture is not None and (ROOT / "docs" / picture[1]).is_file()
    assert (ROOT / "docs" / picture[1]).stat().st_size < 200_000
    words = shlex.split(command.removeprefix("$ ").replace("$DATA", str(testing.data_path)))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code == 0, result.output
    montages = sorted((tmp_path / "out").glob("anatomical_gradcam_*_montage.png"))
    niftis = sorted((tmp_path / "out").glob("anatomical_gradcam_*.nii.gz"))
    assert len(montages) == len(niftis) >= 1, result.output
    assert f"-> out/{niftis[0].name}" in result.stdout
