"""``Session.explain`` hands the inputs to the run of their kind (pipeline/session.py's ``KIND_RUNS``): a new input
kind is one entry, and what comes after its runner (the manifest, the counts) is the session's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from square_model import square_image

from gradcam_cli import Explainer
from gradcam_cli.cam.records import Record
from gradcam_cli.io.discovery import InputImage, InputKind
from gradcam_cli.options import OutputOptions
from gradcam_cli.pipeline import session as sessions
from gradcam_cli.pipeline.session import Session


@pytest.mark.quick
def test_a_new_input_kind_is_one_entry_and_images_keep_theirs(tmp_path, square_model, monkeypatch):
    seen: list[list[InputKind]] = []

    def scans(session, explainer, inputs, videos, progress):
        seen.append([item.kind for item in inputs])
        for item in inputs:
            yield session._keep(Record(str(item.path), "ok", explainer.model.name, explainer.layer_label))

    monkeypatch.setitem(sessions.KIND_RUNS, InputKind.VOLUME, scans)
    scan = InputImage(tmp_path / "case.nii.gz", Path("case"))
    photo = tmp_path / "red.png"
    square_image(colour="red").save(photo)
    explainer = Explainer(square_model, "features")
    manifest = tmp_path / "out" / "m.jsonl"
    with Session(OutputOptions(tmp_path / "out", manifest=manifest)) as session:
        scanned = list(session.explain(explainer, [scan]))
        explained = list(session.explain(explainer, [InputImage(photo, Path("red"))]))
    assert seen == [[InputKind.VOLUME]]
    assert [(r.input, r.status) for r in scanned] == [(str(scan.path), "ok")]
    assert explained[0].status == "ok" and explained[0].fingerprint is not None  # the image's run: BatchRunner's
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [row["input"] for row in rows] == [str(scan.path), str(photo)] and session.counts.ok == 2
