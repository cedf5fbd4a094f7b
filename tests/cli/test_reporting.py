"""Progress and the run's last line: the rate counts images explained, never those skipped (--skip-existing), and
shows only once it means something. Every test here runs on a fake clock and fake counts: nothing waits or times."""

from __future__ import annotations

import errno
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer.testing
from conftest import ROOT
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cli import app
from gradcam_cli.cli import reporting as cli
from gradcam_cli.io.discovery import discover
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.session import Counts, Session

pytestmark = pytest.mark.quick
ALL_EXIST = "(nothing to explain: every output exists)"
SQUARE_MODEL = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def task(throughput: cli.Throughput | None, completed: int, total: int = 10) -> SimpleNamespace:
    """What rich hands a column: a row with its counts and fields."""
    return SimpleNamespace(id=0, total=total, completed=completed, fields={"throughput": throughput})


def columns(row: SimpleNamespace) -> tuple[str, str]:
    rate, time_left = cli.throughput_columns("img")
    return rate.render(row).plain, time_left.render(row).plain


def test_no_rate_until_two_images_are_explained_over_a_second():
    clock = FakeClock()
    throughput = cli.Throughput(clock)
    throughput.tick()
    clock.now += 5.0
    assert throughput.per_second() is None  # one image: start-up, not speed
    throughput.tick()
    assert throughput.per_second() == pytest.approx(2 / 5.0)
    early = cli.Throughput(clock)
    for _ in range(16):  # a whole first batch lands at once
        early.tick()
    clock.now += 0.01
    assert early.per_second() is None  # not 1600 img/s
    assert columns(task(early, 16, total=1016)) == ("", "-:--:--")
    clock.now += 1.99
    assert early.per_second() == pytest.approx(16 / 2.0)
    assert columns(task(early, 16, total=1016)) == ("8.0 img/s", "0:02:05")


def test_skipped_images_advance_the_bar_but_not_its_rate():
    clock = FakeClock()
    bar = cli.ProgressBar(cli.Reporter(quiet=True, verbose=False, as_json=False), 105, clock=clock)
    with bar:
        for _ in range(100):  # --skip-existing: these come first, all at once
            bar(skipped=True)
        clock.now += 0.5
        bar(skipped=True)
        bar()
        clock.now += 2.0
        bar()
        bar(skipped=True)
    assert bar.throughput.explained == 2
    assert bar.throughput.per_second() == pytest.approx(2 / 2.0)  # timed from the last skipped one before them
    assert columns(task(bar.throughput, 104, total=105)) == ("1.0 img/s", "0:00:01")


def test_the_bar_on_a_terminal_shows_the_rate_of_explained_images_only(monkeypatch):
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True, raising=False)
    clock = FakeClock()
    reporter = cli.Reporter(quiet=False, verbose=False, as_json=False)
    with cli.ProgressBar(reporter, 40, clock=clock) as bar:
        for _ in range(30):
            bar(skipped=True)
        (row,) = bar.bar.tasks
        assert row.completed == 30 and columns(row)[0] == ""
        for _ in range(4):
            bar()
        clock.now += 4.0
        assert row.completed == 34 and columns(row) == ("1.0 img/s", "0:00:06")


def test_a_full_bar_shows_its_rate_however_quick_the_run():
    clock = FakeClock()
    throughput = cli.Throughput(clock)
    for _ in range(3):
        throughput.tick()
    clock.now += 0.25
    assert columns(task(throughput, 2, total=3))[0] == ""
    assert columns(task(throughput, 3, total=3)) == ("12.0 img/s", "0:00:00")  # the exact average: nothing to settle


def test_rows_without_their_own_rate_show_none():
    scorecam_passes = task(None, 3)
    scorecam_passes.time_remaining, scorecam_passes.finished, scorecam_passes.finished_time = 12.0, False, None
    assert columns(scorecam_passes) == ("", "0:00:12")


@pytest.mark.parametrize(
    ("counts", "seconds", "expected"),
    [
        (Counts(ok=4, error=2, skipped=10), 2.0, "done: 4 ok, 2 failed, 10 skipped in 2.0s (2.00 images/s)"),
        (Counts(ok=0, error=0, skipped=5), 0.1, f"done: 0 ok, 0 failed, 5 skipped in 0.1s {ALL_EXIST}"),
        (Counts(ok=0, error=3, skipped=1), 0.4, "done: 0 ok, 3 failed, 1 skipped in 0.4s"),
        (Counts(ok=3, error=0, skipped=0), 0.0, "done: 3 ok, 0 failed, 0 skipped in 0.0s"),
    ],
)  # fmt: skip
def test_the_last_line_counts_explained_images_only(counts, seconds, expected):
    assert cli.run_summary(counts, seconds) == expected


def test_the_library_tells_skipped_images_from_explained_ones(tmp_path, square_model):
    for i, colour in enumerate(["red", "green", "blue"]):
        square_image(colour=colour).save(tmp_path / f"img{i}.png")
    images = discover([tmp_path])
    output = OutputOptions(tmp_path / "out", skip_existing=True)
    ticks: list[bool] = []

    class Recording:
        def __init__(self, _label: str, _total: int) -> None:
            pass

        def __enter__(self):
            return lambda skipped=False: ticks.append(skipped)

        def __exit__(self, *exc_info: object) -> None:
            pass

    explainer = Explainer(square_model, "features")
    with Session(output, RunOptions(workers=0)) as session:
        assert [r.status for r in session.explain(explainer, images, progress=Recording)] == ["ok"] * 3
    assert ticks == [False] * 3
    next((tmp_path / "out").glob("img1_*.png")).unlink()
    ticks.clear()
    with Session(output, RunOptions(workers=0)) as session:
        statuses = [r.status for r in session.explain(explainer, images, progress=Recording)]
    assert statuses == ["skipped", "ok", "skipped"]  # rows in input order; the skipped ticks come first
    assert ticks == [True, True, False]


def test_an_all_skipped_run_ends_without_a_rate(tmp_path):
    for i in range(3):
        square_image().save(tmp_path / f"img{i}.png")
    args = [str(tmp_path), "-m", SQUARE_MODEL, "-o", str(tmp_path / "out"), "--workers", "0", "--skip-existing"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "done: 3 ok, 0 failed, 0 skipped in " in first.stderr and "images/s" in first.stderr
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("done: 0 ok, 0 failed, 3 skipped in ")
    assert last.endswith("(nothing to explain: every output exists)")


def test_a_rate_under_one_a_second_shows_the_seconds_each_takes():
    clock = FakeClock()
    slow = cli.Throughput(clock)
    for _ in range(3):
        slow.tick()
        clock.now += 12.5  # scorecam on a big layer: seconds per image
    assert columns(task(slow, 3, total=10)) == ("12.5 s/img", "0:01:28")  # not "0.1 img/s", never "0.0 img/s"
    frames, _ = cli.throughput_columns("frames")
    assert frames.render(task(slow, 3, total=10)).plain == "12.5 s/frame"
    assert cli.rate_text(1.0) == "1.0 img/s" and cli.rate_text(0.999) == "1.0 s/img"


# --- a stdout that stops taking output ---------------------------------------------------------------------------


class FailingStdout(io.StringIO):
    """A stdout that takes ``lines`` lines, then fails every write with ``error``."""

    def __init__(self, lines: int, error: OSError) -> None:
        super().__init__()
        self.left, self.error = lines, error

    def write(self, text: str) -> int:
        if self.left == 0:
            raise self.error
        self.left -= text.count("\n")
        return super().write(text)


@pytest.mark.parametrize(
    ("error", "failure_code", "code", "said"),
    [
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), cli.EXIT_IMAGE_FAILED, 0, "warning: stdout was closed by its "
         "reader after 2 lines; nothing more was printed, but the command ran to its end"),
        (OSError(errno.ENOSPC, "No space left on device"), cli.EXIT_IMAGE_FAILED, 1, "error: cannot write to stdout "
         "after 2 lines (no space left on device); nothing more was printed, but the command ran to its end"),
        (OSError(errno.EIO, "Input/output error"), cli.EXIT_USAGE, 2, "error: cannot write to stdout after 2 lines "
         "(input/output error); nothing more was printed, but the command ran to its end"),
    ],
)  # fmt: skip
def test_a_failing_stdout_stops_the_printing_not_the_command(capsys, error, failure_code, code, said):
    reporter = cli.Reporter(quiet=False, verbose=False, as_json=False, stdout_failure_code=failure_code)
    stdout = FailingStdout(2, error)
    reporter.stdout = stdout
    done: list[int] = []

    def command() -> int:
        for i in range(5):
            reporter.result(f"result {i}")
            done.append(i)
        print("a stray print")  # not a result: on stderr
        return 0

    with pytest.raises(typer.Exit) as exited:
        cli.run_reported(reporter, command)
    assert exited.value.exit_code == code
    assert done == [0, 1, 2, 3, 4]
    assert stdout.getvalue() == "result 0\nresult 1\n"
    assert capsys.readouterr().err.splitlines() == ["a stray print", said]


# --- results above a progress bar ---------------------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_result_lines_above_the_bar_stay_whole_at_any_terminal_width(tmp_path, monkeypatch):
    """On a terminal, results printed while the bar shows go through rich's console, which used to cut them at the
    terminal's width, inside paths. Here both streams claim to be a 40-column terminal."""
    monkeypatch.setattr(typer.testing._NamedTextIOWrapper, "isatty", lambda _self: True)
    monkeypatch.setenv("COLUMNS", "40")
    folder = tmp_path / "a folder with a rather long name"
    folder.mkdir()
    for i in range(3):
        square_image().save(folder / f"photograph number {i}.png")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [str(folder), "-m", SQUARE_MODEL, "-o", str(out), "--workers", "0"])
    assert result.exit_code == 0, result.output
    shown = ANSI.sub("", result.stderr).replace("\r", "\n")  # the terminal: the bar and the lines above it
    lines = [line for line in shown.splitlines() if "gradcam for" in line]
    assert len(lines) == 3, shown
    for i, line in enumerate(lines):
        assert re.fullmatch(
            rf"{re.escape(str(folder / f'photograph number {i}.png'))}: gradcam for \w+ \(\d+\.\d%\) -> "
            rf"{re.escape(str(out / f'photograph number {i}_gradcam_'))}\d-\w+\.png",
            line,
        ), line


@pytest.mark.slow
def test_result_lines_stay_whole_on_a_real_narrow_terminal(tmp_path):
    """The same through a pseudo-terminal 40 columns wide, in a process of its own."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    for i in range(3):
        square_image().save(tmp_path / f"photograph number {i}.png")
    out = tmp_path / "out"
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm")
    args = [str(tmp_path), "-m", SQUARE_MODEL, "-o", str(out), "--workers", "0"]
    process = subprocess.Popen(
        [sys.executable, "-m", "gradcam_cli", *args], stdin=secondary, stdout=secondary, stderr=secondary, env=env
    )
    os.close(secondary)
    shown = b""
    while True:  # until the process has closed the terminal (EIO on Linux, b"" elsewhere)
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    assert process.wait(timeout=600) == 0  # hang guard only
    text = ANSI.sub("", shown.decode()).replace("\r\n", "\n").replace("\r", "\n")
    lines = [line for line in text.splitlines() if "gradcam for" in line]
    assert len(lines) == 3, text
    for i, line in enumerate(lines):
        assert line.startswith(f"{tmp_path / f'photograph number {i}.png'}: gradcam for ")
        assert re.search(rf"-> {re.escape(str(out / f'photograph number {i}_gradcam_'))}\d-\w+\.png$", line), line


# --- RISE's and occlusion's passes --------------------------------------------------------------------------------


def test_rise_and_occlusion_show_their_passes_advancing_with_every_forward_pass(tmp_path, monkeypatch):
    """On a terminal, the black-box methods' masked passes show as a bar, as Score-CAM's do, and it advances with
    every forward pass: two images in one batch, 32 masked inputs per pass, so 16 masks per step."""
    calls: list[tuple[str, int, int]] = []
    shown = cli.PassProgress.__call__
    monkeypatch.setattr(typer.testing._NamedTextIOWrapper, "isatty", lambda _self: True)
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(
        cli.PassProgress, "__call__", lambda self, d, t: (calls.append((self.label, d, t)), shown(self, d, t))
    )
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.png", "b.png"):
        square_image((48, 48), (8, 8, 24, 24)).save(folder / name)
    args = ["--batch-size", "2", "--input-size", "32", "--method", "rise,occlusion", "--rise-masks", "64"]
    args += ["--occlusion-window", "4", "--occlusion-stride", "4", "--workers", "0"]
    result = CliRunner().invoke(app, [str(folder), "-m", SQUARE_MODEL, "-o", str(tmp_path / "out"), *args])
    assert result.exit_code == 0, result.output
    assert "rise/occlusion passes" in result.stderr  # the bar itself
    assert {label for label, _, _ in calls} == {"rise/occlusion passes"}
    # each method's passes: 0, 16, 32, ... total (rise: 64 masks; occlusion: 8 x 8 windows at 32 x 32)
    runs: list[list[int]] = []
    for _, done, total in calls:
        if done == 0:
            runs.append([])
        runs[-1].append(done)
        assert total == 64, calls
        assert runs[-1] == list(range(0, done + 1, 16)), calls
    assert [run[-1] for run in runs] == [64, 64], calls


def test_settings_that_take_long_are_said_before_the_first_image(tmp_path):
    """Occlusion with stride 1 is 37,250 masked passes per image and target at 224 x 224: said at start."""
    (tmp_path / "x.png").write_bytes(b"not an image")  # nothing is explained: only the start-up is seen
    start = [str(tmp_path / "x.png"), "-m", SQUARE_MODEL, "-o", str(tmp_path / "out"), "--workers", "0"]
    for method, more, counts in [
        ("occlusion", ["--occlusion-stride", "1"], "37,250 masked forward passes per image and target (at 224x224"),
        ("rise,occlusion", ["--rise-masks", "20000"], "20,170 masked forward passes per image and target (20,000 for"),
    ]:
        result = CliRunner().invoke(app, [*start, "--method", method, *more])
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warnings) == 1 and counts in warnings[0] and "takes long" in warnings[0], result.stderr
    result = CliRunner().invoke(app, [*start, "--method", "rise,occlusion"])
    assert "warning" not in result.stderr  # the defaults: 4,000 + 170
    from gradcam_cli.cli.eval import app as eval_app

    result = CliRunner().invoke(eval_app, [*start[:3], "--method", "occlusion", "--occlusion-stride", "1"])
    assert "warning: 37,250 masked forward passes per image and target (at 224x224" in result.stderr
