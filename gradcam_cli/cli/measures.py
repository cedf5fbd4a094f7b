"""``gradcam eval``'s options of what it measures and how (docs/evaluation.md), as typer annotations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import params

StepsOpt = Annotated[
    int,
    typer.Option(
        min=2, metavar="N", help="Points on the deletion/insertion curves: each step perturbs 1/N of the pixels."
    ),
]
BatchSizeOpt = Annotated[int, typer.Option(min=1, metavar="N", help="Perturbed images per forward pass.")]
BoxesOpt = Annotated[
    Path | None,
    typer.Option(
        parser=params.parse_path,
        metavar="PATH",
        help="Ground truth: CSV image,x1,y1,x2,y2[,class], or a folder of Pascal VOC XML files.",
    ),
]
MasksOpt = Annotated[
    Path | None,
    typer.Option(
        parser=params.parse_path,
        metavar="DIR",
        help="Scans: label masks named as nnU-Net's labelsTr (CASE.nii.gz for CASE_0000.nii.gz): pointing, energy "
        "and Dice in the explained class's voxels.",
    ),
]
ToleranceOpt = Annotated[float, typer.Option(min=0.0, metavar="PIXELS", help="Pointing-game tolerance in pixels.")]
SanityOpt = Annotated[
    bool, typer.Option("--sanity", help="Run the model-parameter randomisation test (Adebayo et al. 2018).")
]
SanityLayersOpt = Annotated[
    int,
    typer.Option(
        min=1, metavar="N", help="With --sanity: re-initialise the top 1..N parameterised modules, cascading."
    ),
]
RoadOpt = Annotated[
    bool,
    typer.Option(
        "--road",
        help="Also measure ROAD (Rong et al. 2022): the probability with 10, 20, ..., 90% of the pixels removed by "
        "noisy linear imputation, most and least relevant first, and the combined score.",
    ),
]
CorrelationOpt = Annotated[
    bool,
    typer.Option("--faithfulness-correlation", help="Also measure faithfulness correlation (Bhatt et al. 2020)."),
]
ArccOpt = Annotated[
    bool,
    typer.Option("--arcc", help="Also measure ARCC (RefineCAM, ICPR 2026): coherency, complexity and ROAD in one."),
]
RandomLogitOpt = Annotated[
    bool,
    typer.Option(
        "--random-logit", help="Also run the random-logit test (Sixt et al. 2020): SSIM with a random class's map."
    ),
]
MprtOpt = Annotated[
    bool,
    typer.Option(
        "--mprt",
        help="Also run sMPRT and eMPRT (Hedstrom et al. 2023) against a fully randomised copy of the model.",
    ),
]
MetaOpt = Annotated[
    bool,
    typer.Option(
        "--meta",
        help="With --rank: test each metric as MetaQuantus does (Hedstrom et al. 2023): its ranking under input "
        "noise and on a randomised model, and say which metrics to trust.",
    ),
]
MprtSamplesOpt = Annotated[
    int, typer.Option(min=1, metavar="N", help="With --mprt: sMPRT's noisy copies of each image.")
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        parser=params.parse_path,
        metavar="PATH",
        help="Write the mean deletion/insertion curves to this .png, .pdf or .svg.",
    ),
]
StabilityOpt = Annotated[
    bool,
    typer.Option(
        "--stability",
        help="Also measure how much each map changes under small input noise that keeps the prediction.",
    ),
]
