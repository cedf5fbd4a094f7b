"""``--help`` in panels: the options of ``gradcam`` and ``gradcam eval`` grouped under titles, as typer's
``rich_help_panel`` groups them, in plain text as click writes it (the commands use no rich markup), and
``--method``'s list of methods with the installed plugins' (read from their entry points as the help is shown;
nothing imports torch).

Which panel an option is in is one table, :data:`PANELS` (by the parameter's name, for both commands, with
:data:`EVAL_PANELS` where ``gradcam eval`` differs), rather than an argument of each declaration: the shared
declarations of :mod:`.params` serve both commands, and the table shows the grouping whole. An option the table
leaves out is shown under :data:`OTHER` (``tests/models/test_plugins.py`` holds every option to a panel).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from typer.core import TyperCommand, TyperOption

from .params import method_help, plugin_method_names

if TYPE_CHECKING:
    from typer._click.core import Context  # typer's own copy of click
    from typer._click.formatting import HelpFormatter

INPUT = "Input and model"
EXPLAIN = "What to explain"
METHODS = "Methods"
ANSWERS = "Vision-language (--prompt)"
MEASURES = "Measures"
RANKING = "Ranking (--rank)"
OUTPUT = "Output"
RUN = "Run"
OTHER = "Other options"

PANELS: dict[str, tuple[str, ...]] = {
    INPUT: (
        "model",
        "task",
        "weights",
        "num_classes",
        "labels",
        "input_size",
        "max_side",
        "every",
        "clip_stride",
        "fps",
        "channels",
        "list_models",
        "list_layers",
    ),
    EXPLAIN: (
        "layer",
        "target_class",
        "target",
        "top_k",
        "embedding",
        "score",
        "score_threshold",
        "max_detections",
    ),
    METHODS: (
        "method",
        "rise_masks",
        "occlusion_window",
        "occlusion_stride",
        "seed",
        "aug_smooth",
        "eigen_smooth",
        "attention_heads",
    ),
    ANSWERS: ("prompt", "answer", "per_token", "max_new_tokens", "prompts"),
    MEASURES: (
        "steps",
        "boxes",
        "masks",
        "tolerance",
        "sanity",
        "sanity_layers",
        "road",
        "correlation",
        "arcc",
        "random_logit",
        "mprt",
        "mprt_samples",
        "stability",
    ),
    RANKING: ("rank", "report_dir", "budget", "meta"),
    OUTPUT: (
        "output_dir",
        "image_format",
        "quality",
        "alpha",
        "colormap",
        "window_level",
        "save_raw",
        "save_heatmap",
        "panel",
        "report",
        "manifest",
        "plot",
        "as_json",
    ),
    RUN: (
        "device",
        "precision",
        "batch_size",
        "workers",
        "shard",
        "engine",
        "ray_address",
        "actors",
        "gpus_per_worker",
        "deterministic",
        "skip_existing",
        "quiet",
        "verbose",
        "version",
        "help",
    ),
}
"""Each panel's options by parameter name, panels in the order ``--help`` shows them (options in the command's
order within a panel)."""
EVAL_PANELS: dict[str, str] = {"skip_existing": RANKING}
"""Where ``gradcam eval`` puts an option elsewhere than :data:`PANELS` (its ``--skip-existing`` resumes a ranking)."""


class PanelledCommand(TyperCommand):
    """A typer command whose help lists its options panel by panel (:attr:`panel_of`)."""

    panel_of: ClassVar[Mapping[str, str]] = {name: title for title, names in PANELS.items() for name in names}

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        shown: dict[str, list[tuple[str, str]]] = {title: [] for title in [*PANELS, OTHER]}
        for param in self.get_params(ctx):
            if param.name == "method" and isinstance(param, TyperOption):
                param.help = method_help(plugin_method_names())
            record = param.get_help_record(ctx)
            if record is not None:
                shown[self.panel_of.get(param.name or "", OTHER)].append(record)
        for title, records in shown.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


class PanelledEvalCommand(PanelledCommand):
    """``gradcam eval``'s: :data:`PANELS` with :data:`EVAL_PANELS`."""

    panel_of: ClassVar[Mapping[str, str]] = {**PanelledCommand.panel_of, **EVAL_PANELS}
