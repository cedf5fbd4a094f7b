"""``--help`` in panels: the options of ``gradcam`` and ``gradcam eval`` grouped under titles (each option's
``rich_help_panel``, in the order of :data:`~gradcam_cli.cli.params.PANELS`), in plain text as click writes it (the
commands use no rich markup), and ``--method``'s list of methods with the installed plugins' (read from their entry
points as the help is shown; nothing imports torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typer.core import TyperCommand, TyperOption

from .params import PANELS, RUN_PANEL, method_help, plugin_method_names

if TYPE_CHECKING:
    import typer
    from typer._click.formatting import HelpFormatter  # typer's own copy of click


class PanelledCommand(TyperCommand):
    """A typer command whose help lists its options panel by panel; an option without a panel (``--help``) is in
    the last, :data:`~gradcam_cli.cli.params.RUN_PANEL`."""

    def format_options(self, ctx: typer.Context, formatter: HelpFormatter) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            if param.name == "method" and isinstance(param, TyperOption):
                param.help = method_help(plugin_method_names())
            record = param.get_help_record(ctx)
            if record is not None:
                panels.setdefault(getattr(param, "rich_help_panel", None) or RUN_PANEL, []).append(record)
        order = {title: index for index, title in enumerate(PANELS)}
        for title in sorted(panels, key=lambda title: order.get(title, len(order))):
            with formatter.section(title):
                formatter.write_dl(panels[title])
