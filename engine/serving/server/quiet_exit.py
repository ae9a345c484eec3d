"""End a finished server process without the interpreter's teardown, whose only output is noise.

torch imports triton (torch._dynamo probes for it while the model is built), and triton's nanobind
bindings print a ~30-line "nanobind: leaked N functions / types / instances" report while the interpreter
finalizes: nanobind's known complaint about objects still referenced at exit, not a fault of ours. That
report cannot be switched off from Python (triton exposes no `set_leak_warnings`, and the symbol is not
exported), so once everything that matters is done (the drain, the final telemetry flush, then the
interpreter's own exit steps: waiting for non-daemon threads and running the atexit handlers) the
process exits at once, before finalization.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading


def exit_now(code: int) -> None:
    """Exit with `code` after what a normal exit does first, skipping the finalization that prints."""
    main = threading.main_thread()
    for thread in threading.enumerate():  # as the interpreter does before atexit: wait for non-daemon threads
        if thread is not main and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()  # OpenTelemetry's exporters, logging's flush ... (registered handlers)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or gone reader: nothing more to say
            pass
    os._exit(code)
