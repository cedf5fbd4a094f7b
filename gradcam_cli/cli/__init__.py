"""The command line: ``gradcam`` (:mod:`.explain`), ``gradcam eval`` (:mod:`.eval`), ``gradcam diff``
(:mod:`.diff`) and ``gradcam merge`` (:mod:`.merge`).

The commands parse options into :mod:`gradcam_cli.options` and report what the library does; they do no work of
their own. Torch is imported only after parsing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

from .explain import app
from .reporting import run_app
from .signals import interrupt_on_termination

__all__ = ["app", "entry_point", "main"]


def main() -> None:
    """Console-script entry point; ``gradcam eval ...``, ``gradcam diff ...`` and ``gradcam merge ...`` go to their
    own commands."""
    # Before torch loads OpenMP: threads that wait sleep instead of spinning. Spinning threads fight the decoding
    # processes, the writer threads and any other program for the cores (several times slower on a busy machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    interrupt_on_termination()
    if sys.argv[1:2] == ["eval"]:
        from .eval import app as eval_app

        run_app(eval_app, "gradcam eval", sys.argv[2:])
        return
    if sys.argv[1:2] == ["diff"]:
        from .diff import app as diff_app

        run_app(diff_app, "gradcam diff", sys.argv[2:])
        return
    if sys.argv[1:2] == ["serve"]:
        from .serve import app as serve_app

        run_app(serve_app, "gradcam serve", sys.argv[2:])
        return
    if sys.argv[1:2] == ["merge"]:
        from .merge import app as merge_app

        run_app(merge_app, "gradcam merge", sys.argv[2:])
        return
    run_app(app, "gradcam", sys.argv[1:])


def entry_point() -> None:
    """The ``gradcam`` console script and ``python -m gradcam_cli``: :func:`main`, then a quick exit.

    An interpreter that imported PyTorch spends about a second tearing its modules down at exit (torch._dynamo's
    objects alone are hundreds of thousands), after every output is written. Once the command has finished, this
    waits for any thread still running, runs the ``atexit`` handlers (multiprocessing's and Ray's clean-ups among
    them), flushes stdout and stderr, and ends the process without that teardown. An uncaught exception takes the
    ordinary way out.
    """
    try:
        main()
        code: object = 0
    except SystemExit as exit_:
        code = exit_.code
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    if not isinstance(code, int):  # sys.exit("message"), as the interpreter would print it
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
            stream.flush()
    os._exit(code)
