"""The command line: ``gradcam`` (:mod:`.explain`), ``gradcam eval`` (:mod:`.eval`), ``gradcam diff``
(:mod:`.diff`) and ``gradcam merge`` (:mod:`.merge`).

The commands parse options into :mod:`gradcam_cli.options` and report what the library does; they do no work of
their own. Torch is imported only after parsing.
"""

from __future__ import annotations

import os
import sys

from .explain import app
from .reporting import run_app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point; ``gradcam eval ...``, ``gradcam diff ...`` and ``gradcam merge ...`` go to their
    own commands."""
    # Before torch loads OpenMP: threads that wait sleep instead of spinning. Spinning threads fight the decoding
    # processes, the writer threads and any other program for the cores (several times slower on a busy machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if sys.argv[1:2] == ["eval"]:
        from .eval import app as eval_app

        run_app(eval_app, "gradcam eval", sys.argv[2:])
        return
    if sys.argv[1:2] == ["diff"]:
        from .diff import app as diff_app

        run_app(diff_app, "gradcam diff", sys.argv[2:])
        return
    if sys.argv[1:2] == ["merge"]:
        from .merge import app as merge_app

        run_app(merge_app, "gradcam merge", sys.argv[2:])
        return
    run_app(app, "gradcam", sys.argv[1:])
