"""How the commands talk to the user: results on stdout, messages on stderr, progress bars, and errors turned into
one line and an exit code."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, GradcamError, describe, path_error
from ..io.display import displayable
from .layer_notes import layers_notes

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..cam.records import Record
    from ..pipeline.session import Counts


def one_line(text: str) -> str:
    """``text`` as one console line: control characters, line separators and undecodable bytes escaped."""
    return displayable(text)


class Reporter:
    """Results on stdout, one line each (JSON lines with --json); messages on stderr.

    Stdout carries nothing else while :func:`run_reported` runs a command: whatever else prints there (a model
    factory, a package announcing its weights) goes to stderr. A stdout that stops taking output (its reader
    closed it, a full disk) stops the printing, not the command; :func:`run_reported` says so at the end in one
    line, and a failing stdout other than a closed pipe ends with ``stdout_failure_code`` at least.
    """

    def __init__(self, quiet: bool, verbose: bool, as_json: bool, stdout_failure_code: int = EXIT_IMAGE_FAILED) -> None:
        self.quiet, self.verbose, self.as_json = quiet, verbose, as_json
        self.stdout_failure_code = stdout_failure_code
        self.stdout: TextIO | None = sys.stdout
        self.printed = 0
        self.stdout_error: OSError | None = None

    def info(self, message: str) -> None:
        if not self.quiet:
            _to_stderr(one_line(message))

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            _to_stderr(one_line(message))

    def result(self, message: str) -> None:
        if not self.quiet and not self.as_json:
            self.emit(one_line(message))

    def error(self, message: str) -> None:
        _to_stderr(f"error: {one_line(message)}")

    def record(self, record: Record) -> None:
        if self.as_json:
            self.emit(json.dumps(record.to_dict()))

    def emit(self, line: str) -> None:
        """Print ``line`` on stdout as it is (through the progress bar's console while one shows on a terminal);
        after stdout has failed once, nothing."""
        if self.stdout is None or self.stdout_error is not None:
            return
        try:
            bar = ProgressBar.active
            if bar is not None and self.stdout.isatty():
                bar.print(line)
            else:
                self.stdout.write(line + "\n")
                self.stdout.flush()
        except OSError as error:
            self.stdout_error = error
            _silence(self.stdout)
            return
        self.printed += 1

    def stdout_lost(self, code: int) -> int:
        """After a command whose stdout failed: one line saying so, and the exit code to end with."""
        if self.stdout_error is None:
            return code
        lines = f"{self.printed} line{'' if self.printed == 1 else 's'}"
        rest = "nothing more was printed, but the command ran to its end"
        if self.stdout_error.errno == errno.EPIPE:
            self.info(f"warning: stdout was closed by its reader after {lines}; {rest}")
            return code
        self.error(f"cannot write to stdout after {lines} ({describe(self.stdout_error)}); {rest}")
        return max(code, self.stdout_failure_code)


def _to_stderr(line: str) -> None:
    with contextlib.suppress(OSError):  # a closed or full stderr: the exit code still tells
        print(line, file=sys.stderr)


def _silence(stream: TextIO) -> None:
    """Point a failed stdout's descriptor at the null device, so that the flush at exit (of what could not be
    written) does not fail again."""
    with contextlib.suppress(OSError, ValueError):  # no descriptor (a test's stream): nothing flushes it at exit
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)


def run_reported(reporter: Reporter, run: Callable[[], int]) -> None:
    """Run a command's body with stdout kept for results (anything else printed goes to stderr); a GradcamError, a
    path the file system refuses to name (:func:`gradcam_cli.errors.path_error`) or Ctrl-C becomes one error line
    and its exit code, and a failed stdout is reported (:meth:`Reporter.stdout_lost`)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            code = reporter.stdout_lost(run())
    except (GradcamError, OSError) as error:
        usage = error if isinstance(error, GradcamError) else path_error(error)
        if usage is None:
            raise
        if reporter.verbose:
            import traceback

            traceback.print_exc()
        reporter.error(str(usage))
        code = usage.exit_code
    except KeyboardInterrupt:
        reporter.error("interrupted")
        code = EXIT_INTERRUPTED
    raise typer.Exit(code)


def explainer_notes(reporter: Reporter, explainer: Explainer, layers_given: bool) -> None:
    """What ``gradcam`` and ``gradcam eval`` say once the explainer is built: RISE or occlusion settings that take
    long, the methods left out for this model (or for lack of a target), and the layers chosen and why
    (:func:`~gradcam_cli.cli.layer_notes.layers_notes`)."""
    if (warning := passes_warning(explainer)) is not None:
        reporter.info(warning)
    if explainer.chosen.left_out:
        reporter.info(left_out_note(explainer.chosen.left_out))
    if explainer.chosen.need_target:
        from ..cam.untargeted import left_out_for_target

        reporter.info(left_out_for_target(explainer.model, explainer.chosen.need_target))
    for note in layers_notes(explainer, layers_given):
        reporter.info(note)


def left_out_note(methods: Sequence[str]) -> str:
    """What ``--method all`` says of the attention methods it left out (a model without global self-attention)."""
    return f"--method all leaves out {', '.join(methods)} (for transformers only)"


LONG_PASSES = 10_000
"""Masked forward passes per image and target above which RISE and occlusion are said, at start, to take long."""


def pass_methods(names: Sequence[str]) -> list[str]:
    """The methods among ``names`` whose extra forward passes :class:`PassProgress` shows (their registration's
    ``shows_progress``)."""
    from ..cam.methods import METHODS

    return [name for name in names if name in METHODS and METHODS[name].shows_progress]


def passes_warning(explainer: Explainer) -> str | None:
    """What RISE, D-RISE and occlusion will cost where it is more than LONG_PASSES masked forward passes per image and
    target (counted at the smallest network input, ``--input-size`` square), and which options make it less."""
    from ..cam.perturbation import FEWER_PASSES, masked_pass_counts

    spec = explainer.model.input_spec
    height, width = spec.fixed_size or (spec.size, spec.size)
    counts = masked_pass_counts(explainer.options.perturbation, (height, width))
    chosen = {method: counts[method] for method in counts if method in explainer.chosen.methods}
    total = sum(chosen.values())
    if total <= LONG_PASSES:
        return None
    parts = " + ".join(f"{count:,} for {method}" for method, count in chosen.items()) + ", " if len(chosen) > 1 else ""
    hints = " or ".join(dict.fromkeys(FEWER_PASSES[method] for method in chosen))
    per = "per image" if list(chosen) == ["drise"] else "per image and target"  # D-RISE's serve every detection
    return (
        f"warning: {total:,} masked forward passes {per} ({parts}at {height}x{width} or more): "
        f"this takes long; {hints} takes fewer"
    )


def run_summary(counts: Counts, seconds: float, unit: str = "images") -> str:
    """The line that ends a run of several inputs; its rate counts the inputs explained (``unit``: images, or
    inputs when videos are among them), not those skipped or failed, and is left out when there is none."""
    line = f"done: {counts.ok} ok, {counts.error} failed, {counts.skipped} skipped in {seconds:.1f}s"
    if counts.ok and seconds > 0:
        return f"{line} ({counts.ok / seconds:.2f} {unit}/s)"
    if counts.skipped and not counts.error and not counts.ok:
        return f"{line} (nothing to explain: every output exists)"
    return line


def duration(seconds: float) -> str:
    """``seconds`` as a summary line shows them: ``1.2s``, and under 0.1 s in milliseconds (``41 ms``, never a
    ``0.0s`` that reads as nothing measured)."""
    return f"{seconds * 1000:.0f} ms" if seconds < 0.1 else f"{seconds:.1f}s"


MIN_EXPLAINED_FOR_RATE = 2
MIN_SECONDS_FOR_RATE = 1.0


class Throughput:
    """Images (or frames) explained per second, for a progress bar: images skipped because their outputs exist
    advance the bar but not the rate, and there is no rate until it means something: at least
    ``MIN_EXPLAINED_FOR_RATE`` explained over at least ``MIN_SECONDS_FOR_RATE`` seconds (or the bar is full)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.explained = 0

    def tick(self, skipped: bool = False) -> None:
        if not skipped:
            self.explained += 1
        elif self.explained == 0:  # skipped images come first: the clock starts when work on the others does
            self.started = self.clock()

    def per_second(self, finished: bool = False) -> float | None:
        """The rate so far, or None while it would say more about start-up than about speed."""
        elapsed = self.clock() - self.started
        if self.explained < MIN_EXPLAINED_FOR_RATE or elapsed <= 0:
            return None
        if elapsed < MIN_SECONDS_FOR_RATE and not finished:
            return None
        return self.explained / elapsed

    def seconds_left(self, remaining: float) -> float | None:
        """Time to explain ``remaining`` more at the rate so far (None while there is no rate)."""
        if remaining <= 0:
            return 0.0
        rate = self.per_second()
        return remaining / rate if rate else None


def rate_text(per_second: float, unit: str = "img") -> str:
    """``12.3 img/s``; below one a second, the seconds each takes (``4.2 s/img``), never ``0.0 img/s``."""
    if per_second >= 1:
        return f"{per_second:.1f} {unit}/s"
    return f"{1 / per_second:.1f} s/{unit.removesuffix('s')}"


def throughput_columns(unit: str = "img") -> list[Any]:
    """The rate and time-left columns: from the :class:`Throughput` in a row's ``throughput`` field where it has one
    (the image or frame row); other rows (scorecam's passes) show no rate and rich's own time left. Built lazily:
    rich loads only when a bar is shown."""
    from rich.progress import ProgressColumn, TimeRemainingColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            throughput: Throughput | None = task.fields.get("throughput")
            if throughput is None:
                return Text("")
            rate = throughput.per_second(finished=task.total is not None and task.completed >= task.total)
            return Text(rate_text(rate, unit) if rate else "", style="progress.data.speed")

    class TimeLeftColumn(TimeRemainingColumn):
        def render(self, task: Any) -> Text:
            throughput: Throughput | None = task.fields.get("throughput")
            if throughput is None:
                return super().render(task)
            seconds = throughput.seconds_left(max(0.0, (task.total or 0) - task.completed))
            if seconds is None:
                return Text("-:--:--", style="progress.remaining")
            minutes, whole_seconds = divmod(round(seconds), 60)
            hours, minutes = divmod(minutes, 60)
            return Text(f"{hours:d}:{minutes:02d}:{whole_seconds:02d}", style="progress.remaining")

    return [RateColumn(), TimeLeftColumn()]


class ProgressBar:
    """A rich progress bar on stderr when it is a terminal and not --quiet; otherwise a no-op callback.

    Call it once per image: ``bar()`` for one explained (or failed), ``bar(skipped=True)`` for one skipped because
    its outputs exist, which advances the bar but not its rate. Lines printed while it shows go above it, each
    left whole for the terminal to wrap (rich would cut them at its width, inside paths)."""

    def __init__(
        self, reporter: Reporter, total: int, label: str = "explaining", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.enabled = total > 1 and not reporter.quiet and sys.stderr.isatty()
        self.total = total
        self.label = label
        self.throughput = Throughput(clock)

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                *throughput_columns(next((u for u in ("frames", "windows") if self.label.endswith(u)), "img")),
                console=Console(stderr=True, soft_wrap=True),
                transient=True,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total, throughput=self.throughput)
            ProgressBar.active = self
        return self

    def print(self, line: str) -> None:
        """``line`` above the bar, as it is (no markup, no highlighting, no wrapping of its own)."""
        from rich.text import Text

        self.bar.console.print(Text(line), soft_wrap=True)

    def __call__(self, skipped: bool = False) -> None:
        self.throughput.tick(skipped)
        if self.enabled:
            self.bar.advance(self.task)

    def describe(self, text: str) -> None:
        """Show ``text`` as the bar's label now (what it is working on)."""
        self.label = text
        if self.enabled:
            self.bar.update(self.task, description=text)
            self.bar.refresh()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            ProgressBar.active = None
            self.bar.__exit__(exc_type, exc, tb)

    active: ProgressBar | None = None
    """The bar on screen, if any: scorecam's forward passes show as a second row in it."""


class PassProgress:
    """scorecam's masked and ablationcam's ablated forward passes as a transient bar on stderr (terminal and not
    --quiet only): a row of its own under the image bar when that shows, else a bar of its own, named ``label``."""

    def __init__(self, reporter: Reporter, label: str = "scorecam passes") -> None:
        self.reporter = reporter
        self.label = label
        self.own: ProgressBar | None = None
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            if done >= total or self.reporter.quiet or not sys.stderr.isatty():
                return
            host = ProgressBar.active
            if host is None:
                self.own = ProgressBar(self.reporter, total, self.label).__enter__()
                if not self.own.enabled:
                    self.own = None
                    return
                self.bar, self.task = self.own.bar, self.own.task
                self.bar.update(self.task, throughput=None)  # set by count, not ticked: rich's own time left
            else:
                self.bar, self.task = host.bar, host.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)
        if done >= total:
            if self.own is not None:
                self.own.__exit__(None, None, None)
                self.own = None
            else:
                self.bar.remove_task(self.task)
            self.task = None


def run_app(typer_app: typer.Typer, prog_name: str, args: list[str]) -> None:
    """Run a typer app; option-parsing mistakes end in one line on stderr and exit 2, not click's usage block."""
    try:
        code = typer_app(args=args, prog_name=prog_name, standalone_mode=False)
    except Exception as error:
        # click's ClickException (typer >= 0.2x vendors click): duck-typed so that every typer version works.
        if type(error).__name__ == "Abort":
            print("error: interrupted", file=sys.stderr)
            code = EXIT_INTERRUPTED
        elif hasattr(error, "format_message"):
            print(f"error: {error.format_message()} (see {prog_name} --help)", file=sys.stderr)
            code = getattr(error, "exit_code", EXIT_USAGE)
        else:
            raise
    sys.exit(code or EXIT_OK)
