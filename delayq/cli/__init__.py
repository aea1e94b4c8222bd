"""The ``delayq`` command: one module per command group, assembled in ``main.py``."""

from delayq.cli.main import load_app, main

__all__ = ["load_app", "main"]
