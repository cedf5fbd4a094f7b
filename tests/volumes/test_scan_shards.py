"""``--shard K/N`` with scans (docs/batch.md, "Sharding"): scans split by their paths as images are, each shard
writing its maps (NIfTI, montage, ``.npy``) and its own manifest into the shared folder, and ``gradcam merge``
joining them into the rows, files and gallery of one run; ``--skip-existing`` resumes a shard scan by scan."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import comparable
from typer.testing import CliRunner
from volume_models import save_ct_scan, save_nnunet_folder, volume

from gradcam_cli.cli import app
from gradcam_cli.cli.merge import app as merge_app
from gradcam_cli.errors import EXIT_OK

nibabel = pytest.importorskip("nibabel")
pytest.importorskip("dynamic_network_architectures")


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def merge(out: Path):
    return CliRunner().invoke(merge_app, [str(out)])


@pytest.fixture(scope="module")
def scans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three tiny scans in a small tree: a CT NIfTI and two ``.npy`` volumes of other shapes."""
    folder = tmp_path_factory.mktemp("scans") / "in"
    (folder / "sub").mkdir(parents=True)
    save_ct_scan(folder / "head.nii.gz")
    np.save(folder / "cube.npy", volume((16, 17, 18)).numpy() * 300)
    np.save(folder / "sub" / "cube2.npy", volume((17, 16, 18), seed=2).numpy() * 300)
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder, _ = save_nnunet_folder(tmp_path_factory.mktemp("nnunet"))
    return f"nnunet:{folder}"


def maps(out: Path) -> dict[str, Path]:
    """Every map file (NIfTI, montage, ``.npy``) by its path in the folder."""
    return {
        str(path.relative_to(out)): path
        for path in out.rglob("*")
        if path.is_file() and path.name.endswith((".nii.gz", ".png", ".npy")) and not path.name.startswith(".")
    }


def shards(scans: Path, model: str, out: Path, *more: str, merged: bool = False) -> list[int]:
    """Both shards of two run into ``out`` (``merged``: once already); how many scans each took."""
    sizes = []
    for k in range(2):
        result = run(
            scans, "-m", model, "-o", out, "--save-raw", "--report", "--top-k", "2", "--shard", f"{k}/2", *more
        )
        assert result.exit_code == EXIT_OK, result.output
        assert merged or not (out / "index.html").exists()  # the gallery is the merge's
        found = re.search(rf"shard {k}/2: (\d+) of 3 inputs", result.stderr)
        assert found is not None, result.stderr
        sizes.append(int(found.group(1)))
    return sizes


@pytest.mark.slow
def test_merged_shards_of_scans_equal_one_run_and_skip_existing_resumes_them(scans, model, tmp_path: Path):
    local, sharded = tmp_path / "local", tmp_path / "sharded"
    ran = run(
        scans, "-m", model, "-o", local, "--save-raw", "--report", "--top-k", "2", "--manifest", local / "m.jsonl"
    )
    assert ran.exit_code == EXIT_OK, ran.output
    sizes = shards(scans, model, sharded, "--manifest", str(sharded / "m.jsonl"))
    assert sum(sizes) == 3 and min(sizes) > 0
    merged = merge(sharded)
    assert merged.exit_code == EXIT_OK, merged.output
    assert (
        merged.stderr.splitlines()[-1] == f"merged 2 of 2 shards into {sharded / 'm.jsonl'}: 3 ok, 0 failed, 0 skipped"
    )
    expected = comparable(local / "m.jsonl", local)
    assert comparable(sharded / "m.jsonl", sharded) == expected and len(expected) == 3 * 2  # two classes per scan
    mine, theirs = maps(sharded), maps(local)
    assert sorted(mine) == sorted(theirs) and len(mine) == 3 * 2 * 3  # NIfTI, montage, .npy per class
    for name, path in theirs.items():
        if name.endswith(".nii.gz"):
            assert np.array_equal(nibabel.load(mine[name]).get_fdata(), nibabel.load(path).get_fdata()), name
        elif name.endswith(".npy"):
            assert np.array_equal(np.load(mine[name]), np.load(path)), name
        else:
            assert mine[name].read_bytes() == path.read_bytes(), name
    assert "cube2_gradcam_" in (sharded / "index.html").read_text()  # the merged gallery shows every scan

    # --skip-existing across the shards: a scan whose maps are gone is explained again, in its own shard, the
    # others keep their rows; merged, they are the one run's again
    gone = sorted(sharded.rglob("cube2_gradcam_*.nii.gz"))
    assert len(gone) == 2
    for path in gone:
        path.unlink()
    shards(scans, model, sharded, "--manifest", str(sharded / "m.jsonl"), "--skip-existing", merged=True)
    merged = merge(sharded)
    assert merged.exit_code == EXIT_OK, merged.output
    assert merged.stderr.splitlines()[-1].endswith(": 1 ok, 0 failed, 2 skipped")
    again = comparable(sharded / "m.jsonl", sharded)
    statuses = {(Path(row["input"]).name, row["status"]) for row in again}
    assert statuses == {("head.nii.gz", "skipped"), ("cube.npy", "skipped"), ("cube2.npy", "ok")}
    for row in again:
        row["status"] = "ok"
    assert again == expected
