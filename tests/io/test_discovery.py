"""Finding images: recursion, case, symlink cycles, mirrored output names that never collide, globs, exclusion."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from gradcam_cli.errors import UsageError
from gradcam_cli.io.discovery import discover
from gradcam_cli.io.naming import output_path, slug

pytestmark = pytest.mark.quick


def touch(path: Path, content: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def names(images, root: Path) -> list[str]:
    return [image.path.relative_to(root).as_posix() for image in images]


def stems(images) -> list[str]:
    return [image.output_stem.as_posix() for image in images]


def test_recursive_case_insensitive_suffixes_in_a_deterministic_order(tmp_path):
    wanted = ["a.JPG", "b.Jpeg", "c.TIFF", "d.gif", "e.png", "f.webp", "g.bmp", "h.tif", "sub/deeper/i.jpg", "Z.png"]
    for name in [*wanted, "notes.txt", "model.pt", "movie.mp4", ".hidden.jpg", ".cache/j.jpg", "sub/.x/k.png"]:
        touch(tmp_path / name)
    found = discover([tmp_path])
    assert names(found, tmp_path) == ["a.JPG", "b.Jpeg", "c.TIFF", "d.gif", "e.png", "f.webp", "g.bmp", "h.tif",
                                      "sub/deeper/i.jpg", "Z.png"]  # fmt: skip
    assert stems(found)[-2:] == ["sub/deeper/i", "Z"]
    assert discover([tmp_path]) == found  # same order every time


def test_a_named_file_is_always_tried_whatever_its_name(tmp_path):
    (found,) = discover([touch(tmp_path / "photo.dat")])
    assert found.output_stem == Path("photo")


def test_symlink_cycles_terminate_and_each_file_comes_once(tmp_path):
    touch(tmp_path / "top.jpg")
    touch(tmp_path / "sub" / "inner.jpg")
    os.symlink("..", tmp_path / "sub" / "up")  # a directory link to its parent
    os.symlink(".", tmp_path / "sub" / "self")  # and to itself
    os.symlink(tmp_path / "sub", tmp_path / "again")  # the same folder under a second name
    found = discover([tmp_path])
    assert sorted(p.path.name for p in found) == ["inner.jpg", "top.jpg"]


def test_same_names_in_different_folders_get_different_outputs(tmp_path):
    for folder in ["cats", "dogs", "dogs/puppies"]:
        touch(tmp_path / folder / "img.jpg")
    found = discover([tmp_path])
    assert stems(found) == ["cats/img", "dogs/img", "dogs/puppies/img"]
    paths = {output_path(tmp_path / "out", image, "gradcam", 1, "x", ".png") for image in found}
    assert len(paths) == 3


def test_same_stem_different_suffix_and_case_only_clashes_are_made_unique(tmp_path):
    for name in ["x.jpg", "x.png", "Y.jpg", "y.jpg"]:
        touch(tmp_path / name)
    found = discover([tmp_path])
    keys = [s.casefold() for s in stems(found)]
    assert len(set(keys)) == 4, stems(found)
    assert {"x.jpg", "x.png"} <= set(stems(found))


def test_several_roots_lead_with_their_distinguishing_path(tmp_path):
    for folder in ["d1/photos", "d2/photos"]:
        touch(tmp_path / folder / "a.jpg")
    found = discover([tmp_path / "d1" / "photos", tmp_path / "d2" / "photos"])
    assert stems(found) == ["d1/photos/a", "d2/photos/a"]
    touch(tmp_path / "cats" / "a.jpg")
    touch(tmp_path / "dogs" / "a.jpg")
    assert stems(discover([tmp_path / "cats", tmp_path / "dogs"])) == ["cats/a", "dogs/a"]


def test_a_named_file_beside_a_tree_with_the_same_name_does_not_collide(tmp_path):
    touch(tmp_path / "tree" / "a.jpg")
    touch(tmp_path / "loose" / "a.jpg")
    found = discover([tmp_path / "tree", tmp_path / "loose" / "a.jpg"])
    assert len({s.casefold() for s in stems(found)}) == 2


def test_the_same_file_given_twice_is_explained_once(tmp_path):
    path = touch(tmp_path / "a.jpg")
    assert len(discover([path, tmp_path, str(tmp_path / "*.jpg")])) == 1


def test_globs_expand_recursively_and_keep_to_images(tmp_path):
    for name in ["a/x.jpg", "a/b/y.PNG", "a/readme.txt", "c/z.jpg"]:
        touch(tmp_path / name)
    found = discover([str(tmp_path / "a" / "**" / "*")])
    assert names(found, tmp_path) == ["a/b/y.PNG", "a/x.jpg"]
    assert stems(found) == ["b/y", "x"]
    assert names(discover([str(tmp_path / "*")]), tmp_path) == ["a/b/y.PNG", "a/x.jpg", "c/z.jpg"]
    with pytest.raises(UsageError, match="no images match"):
        discover([str(tmp_path / "*.gif")])


def test_missing_input_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        discover([tmp_path / "nope"])


def test_output_dir_inside_the_inputs_is_never_searched(tmp_path):
    touch(tmp_path / "a.jpg")
    out = tmp_path / "out"
    Image.new("RGB", (8, 8)).save(touch(out / "a_gradcam_1-x.png"))
    assert names(discover([tmp_path], exclude=out), tmp_path) == ["a.jpg"]
    with pytest.raises(UsageError):  # only the excluded folder's images match
        discover([str(tmp_path / "**" / "*.png")], exclude=out)
    # reached through a symlink, it is still the output directory
    os.symlink(out, tmp_path / "link")
    assert names(discover([tmp_path], exclude=tmp_path / "link"), tmp_path) == ["a.jpg"]


def test_output_dir_equal_to_an_input_dir_is_refused(tmp_path):
    touch(tmp_path / "a.jpg")
    with pytest.raises(UsageError, match="input directory"):
        discover([tmp_path], exclude=tmp_path)


def test_dangling_symlinks_are_found_so_that_they_can_be_reported(tmp_path):
    touch(tmp_path / "a.jpg")
    os.symlink(tmp_path / "gone.jpg", tmp_path / "broken.jpg")
    assert names(discover([tmp_path]), tmp_path) == ["a.jpg", "broken.jpg"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads directories whatever their mode")
def test_unreadable_directory_is_reported_and_skipped(tmp_path):
    touch(tmp_path / "a.jpg")
    locked = tmp_path / "locked"
    touch(locked / "b.jpg")
    locked.chmod(0)
    warnings: list[str] = []
    try:
        assert names(discover([tmp_path], warn=warnings.append), tmp_path) == ["a.jpg"]
    finally:
        locked.chmod(0o755)
    assert len(warnings) == 1 and "locked" in warnings[0]


def test_method_slugs_keep_plus_so_gradcam_and_gradcam_plus_plus_differ():
    assert slug("gradcam++") == "gradcam++"
    assert slug("gradcam") != slug("gradcam++")
    assert slug("Egyptian cat") == "egyptian-cat"
    assert slug("...") == "class"
