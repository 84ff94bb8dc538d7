"""The run's decision log: each decision (the memory plan's blocks and storage, the metric's
factorisation, screening, the CPU library of a product) logged at debug level where it is made, on
the logger "dfmp2", as PySCF logs its own; `--debug` shows it on standard error (`show_decisions`)."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("dfmp2")


def show_decisions(stream=None) -> logging.Handler:
    """Log the decisions (debug level and above) to `stream` (standard error; once per stream);
    the handler that writes them."""
    stream = stream or sys.stderr
    for handler in log.handlers:
        if getattr(handler, "stream", None) is stream:
            return handler
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("dfmp2: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    return handler
