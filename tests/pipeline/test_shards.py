"""``--shard K/N`` and ``gradcam merge``: the split depends only on each input's relative path, N shards cover every
input once, shards share one output folder (and nothing else may write there meanwhile), and the merged shards are
one local run, map for map and row for row; merge refuses what is not one run."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import comparable
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.cli.merge import app as merge_app
from gradcam_cli.cli.reporting import run_app
from gradcam_cli.errors import UsageError
from gradcam_cli.io.discovery import InputImage, discover
from gradcam_cli.io.lock import FolderLock
from gradcam_cli.io.naming import LOCK_NAME, shard_file_name, shard_lock_name
from gradcam_cli.options import OutputOptions, RunOptions, Shard
from gradcam_cli.pipeline.session import Session
from gradcam_cli.pipeline.shards import ShardRecord, select_shard, shard_key, shard_of

ROOT = Path(__file__).resolve().parents[2]
SQUARE_MODEL = f"{ROOT / 'tests' / 'square_model.py'}:build"
SHAPES = [(120, 80), (80, 120), (96, 96)]
COLOURS = ["red", "green", "blue"]


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """Twelve images of three shapes and colours in a small tree, a file that is no image, and a labels file."""
    folder = tmp_path / "in"
    for i in range(12):
        where = folder / ("cats" if i % 3 == 0 else "dogs/big" if i % 3 == 1 else "")
        where.mkdir(parents=True, exist_ok=True)
        square_image(SHAPES[i % 3], (10, 10 + i, 40, 40 + i), COLOURS[i % 3]).save(where / f"p{i:02d}.png")
    (folder / "broken.png").write_bytes(b"not an image")
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    return folder


def gradcam(photos: Path, out: Path, *more: str | Path):
    args = [photos, "-m", SQUARE_MODEL, "--labels", photos.parent / "labels.txt", "--workers", "0", "-o", out]
    return CliRunner().invoke(app, [str(a) for a in [*args, *more]])


def merge(*args: str | Path):
    return CliRunner().invoke(merge_app, [str(a) for a in args])


def outputs(out: Path) -> dict[str, Path]:
    """Every output file (not manifests, records or locks), by its path in the folder."""
    return {
        str(path.relative_to(out)): path
        for path in out.rglob("*")
        if path.is_file() and not path.name.startswith(".") and "manifest" not in path.name and path.suffix != ".html"
    }


def gallery_data(out: Path) -> list[dict]:
    page = (out / "index.html").read_text(encoding="utf-8")
    match = re.search(r'<script id="gallery-data" type="application/json">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


# ----------------------------------------------------------------------------------------------------- the split


def test_the_shard_of_an_input_depends_only_on_its_path_relative_to_its_root():
    here = InputImage(Path("/data/photos/cats/a.jpg"), Path("cats/a"))
    elsewhere = InputImage(Path("/mnt/nfs/x/photos/cats/a.jpg"), Path("cats/a"))  # another machine's mount point
    windows = InputImage(Path("D:/photos/cats/a.jpg"), Path("cats") / "a")
    assert shard_key(here) == shard_key(elsewhere) == shard_key(windows) == "cats/a.jpg"
    assert [shard_of(image, 8) for image in (here, elsewhere, windows)] == [shard_of(here, 8)] * 3
    # SHA-256 of the key, not Python's per-process hash: the split is the same in every process and version
    assert [shard_of(InputImage(Path(f"/x/{n}.jpg"), Path(str(n))), 8) for n in range(8)] == [4, 1, 4, 4, 3, 7, 4, 2]


def test_a_name_in_either_unicode_form_falls_in_the_same_shard():
    composed, decomposed = unicodedata.normalize("NFC", "café.jpg"), unicodedata.normalize("NFD", "café.jpg")
    assert composed != decomposed  # as Linux and macOS file systems may spell the same name
    first = InputImage(Path(composed), Path("café"))
    second = InputImage(Path(decomposed), Path(unicodedata.normalize("NFD", "café")))
    assert shard_key(first) == shard_key(second)


@pytest.mark.quick
def test_n_shards_cover_every_input_once_whatever_the_discovery_order(photos):
    images = discover([photos])
    for count in (1, 2, 3, 5):
        parts = [select_shard(images, Shard(k, count)) for k in range(count)]
        places = sorted(place for part in parts for place, _ in part)
        assert places == list(range(len(images)))
        shuffled = [select_shard(list(reversed(images)), Shard(k, count)) for k in range(count)]
        assert [{str(i.path) for _, i in part} for part in parts] == [{str(i.path) for _, i in p} for p in shuffled]


@pytest.mark.quick
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3/3", "shard 3/3: K must be 0 to N-1, and N at least 1"),
        ("x", "'x': use K/N, for example 0/8 (K from 0 to N-1)"),
    ],
)
def test_a_bad_shard_is_one_line(photos, tmp_path, capsys, value, message):
    with pytest.raises(SystemExit) as exit:
        run_app(app, "gradcam", [str(photos), "--shard", value])
    assert exit.value.code == 2
    assert capsys.readouterr().err == f"error: Invalid value for '--shard': {message} (see gradcam --help)\n"


# ------------------------------------------------------------------------------------- merged shards = local run


def test_merged_shards_equal_one_local_run_map_for_map_and_row_for_row(photos, tmp_path):
    local, sharded = tmp_path / "local", tmp_path / "sharded"
    common = ["--save-raw", "--report"]
    ran = gradcam(photos, local, *common, "--manifest", local / "manifest.jsonl")
    assert ran.exit_code == 1  # broken.png
    sizes = []
    for k in range(3):
        shard = gradcam(photos, sharded, *common, "--shard", f"{k}/3")
        assert shard.exit_code in (0, 1), shard.output
        assert f"shard {k}/3: " in shard.stderr
        sizes.append(int(re.search(rf"shard {k}/3: (\d+) of 13 inputs", shard.stderr).group(1)))
        assert not (sharded / "index.html").exists()  # the gallery is the merge's
    assert sum(sizes) == 13 and min(sizes) > 0

    merged = merge(sharded)
    assert merged.exit_code == 1, merged.output  # as the local run: one input failed
    assert merged.stderr.splitlines() == [
        f"gallery written to {sharded / 'index.html'}",
        f"merged 3 of 3 shards into {sharded / 'manifest.jsonl'}: 12 ok, 1 failed, 0 skipped",
    ]
    assert comparable(sharded / "manifest.jsonl", sharded) == comparable(local / "manifest.jsonl", local)
    mine, theirs = outputs(sharded), outputs(local)
    assert sorted(mine) == sorted(theirs) and len(mine) == 12 * 3  # overlay, .npy, thumbnail each
    for name, path in theirs.items():
        if name.endswith(".npy"):
            assert np.array_equal(np.load(mine[name]), np.load(path)), name
        elif not name.startswith("_thumbs"):
            assert mine[name].read_bytes() == path.read_bytes(), name
    assert gallery_data(sharded) == gallery_data(local)
    drift = CliRunner().invoke(diff_app, [str(local / "manifest.jsonl"), str(sharded)])
    assert drift.exit_code == 0, drift.output


@pytest.mark.quick
def test_a_csv_manifest_is_merged_as_csv(photos, tmp_path):
    out = tmp_path / "out"
    for k in range(2):
        assert gradcam(photos, out, "--manifest", out / "rows.csv", "--shard", f"{k}/2").exit_code in (0, 1)
    assert sorted(p.name for p in out.glob("rows*.csv")) == ["rows.shard-0-of-2.csv", "rows.shard-1-of-2.csv"]
    assert merge(out).exit_code == 1
    lines = (out / "rows.csv").read_text().splitlines()
    assert lines[0].startswith("input,status,error,outputs") and len(lines) == 1 + 13
    assert [line.split(",")[0] for line in lines[1:]] == [str(image.path) for image in discover([photos])]


# ------------------------------------------------------------------------------------------- what merge refuses


def test_merge_names_missing_and_unfinished_shards_and_merges_the_rest_with_partial(photos, tmp_path):
    out = tmp_path / "out"
    assert gradcam(photos, out, "--shard", "0/3").exit_code in (0, 1)
    assert gradcam(photos, out, "--shard", "2/3").exit_code in (0, 1)
    record = ShardRecord.read(out / shard_file_name("2-of-3"))
    record.finished = False  # as a shard killed halfway leaves it
    record.write(out)
    refused = merge(out)
    assert refused.exit_code == 2
    assert refused.stderr == (
        f"error: {out}: shard 1 of 3 never ran and shard 2 did not finish; run them (with --skip-existing to "
        "resume), or merge the rest with --partial\n"
    )
    assert not (out / "manifest.jsonl").exists()
    partial = merge(out, "--partial")
    assert partial.exit_code in (0, 1)
    assert "warning: left out shards 1, 2 (missing or unfinished)" in partial.stderr
    inputs = {json.loads(line)["input"] for line in (out / "manifest.jsonl").read_text().splitlines()}
    assert inputs == {str(image.path) for k in (0, 2) for _, image in select_shard(discover([photos]), Shard(k, 3))}


def test_merge_refuses_shards_made_with_other_settings_or_over_other_inputs(photos, tmp_path):
    out = tmp_path / "out"
    assert gradcam(photos, out, "--shard", "0/2").exit_code in (0, 1)
    assert gradcam(photos, out, "--shard", "1/2", "--colormap", "viridis").exit_code in (0, 1)
    refused = merge(out)
    assert refused.exit_code == 2
    assert refused.stderr == (
        "error: shards 0 and 1 were made with different settings: colormap jet (shard 1: viridis)\n"
    )
    (photos / "extra.png").write_bytes((photos / "p02.png").read_bytes())
    assert gradcam(photos, out, "--shard", "1/2").exit_code in (0, 1)
    refused = merge(out)
    assert refused.stderr == (
        "error: shards 0 and 1 were run over different inputs (13 and 14 found); give every shard the same INPUT "
        "arguments\n"
    )


def test_merge_of_a_folder_without_shards_or_of_two_splits_is_one_line(photos, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert merge(out).stderr == f"error: {out} holds no shards; run gradcam with --shard K/N into it first\n"
    assert merge(tmp_path / "nowhere").stderr == f"error: {tmp_path / 'nowhere'}: no such folder\n"
    assert gradcam(photos, out, "--shard", "0/2").exit_code in (0, 1)
    assert gradcam(photos, out, "--shard", "0/3").exit_code in (0, 1)
    assert merge(out).stderr == (
        f"error: {out} holds runs split into 2 shards and 3 shards; delete the .gradcam-shard-*-of-N.json files of "
        "the split you no longer use\n"
    )


# ---------------------------------------------------------------------------------------- one folder, many shards


def test_shards_share_the_output_folder_but_nothing_else_writes_there_meanwhile(photos, tmp_path):
    out = tmp_path / "out"
    first = Session(OutputOptions(out), RunOptions(shard=Shard(0, 2)))
    with first:
        with Session(OutputOptions(out), RunOptions(shard=Shard(1, 2))):  # another shard: welcome
            pass
        with pytest.raises(UsageError, match=rf"another gradcam run \(pid {os.getpid()}\) is writing to shard 0/2 of"):
            Session(OutputOptions(out), RunOptions(shard=Shard(0, 2))).__enter__()  # the same shard twice: no
        alone = gradcam(photos, out)  # an ordinary run needs the folder to itself
        assert alone.exit_code == 2
        assert alone.stderr == (
            f"error: another gradcam run is writing to {out}; wait for it or choose another --output-dir\n"
        )
        assert (
            merge(out).stderr == f"error: a gradcam run is still writing to {out}; merge once every shard has ended\n"
        )
    assert not (out / shard_lock_name("0-of-2")).exists()
    # an ordinary run holds the folder: no shard may start
    with FolderLock(out / LOCK_NAME, out, "--output-dir"), pytest.raises(UsageError, match="another gradcam run"):
        Session(OutputOptions(out), RunOptions(shard=Shard(1, 2))).__enter__()
