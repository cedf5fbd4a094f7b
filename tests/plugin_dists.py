"""Throwaway plugin distributions for tests: a folder holding a package's modules and its ``*.dist-info`` (METADATA
and ``entry_points.txt``), as ``pip install`` would leave them, which a ``gradcam`` subprocess finds through
``PYTHONPATH``: its entry points are real ones (``importlib.metadata`` reads them), nothing is installed into the
environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_dist(
    folder: Path, name: str, version: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str]
) -> Path:
    """``folder`` with the modules ``{module name: source}`` and the distribution ``name`` ``version`` declaring
    ``entry_points`` (``{group: {entry point name: "module:object" or "module"}}``); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (folder / f"{module}.py").write_text(source, encoding="utf-8")
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    sections = [
        f"[{group}]\n" + "".join(f"{point} = {value}\n" for point, value in points.items())
        for group, points in entry_points.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(sections), encoding="utf-8")
    return folder


def run_gradcam(
    *args: str | Path, plugins: Path | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``gradcam ARGS`` (``gradcam eval ARGS`` with ``"eval"`` first) in a subprocess of this checkout, with the
    distributions in ``plugins`` installed besides the environment's."""
    paths = [str(ROOT), *([str(plugins)] if plugins is not None else []), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path), "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "gradcam_cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
