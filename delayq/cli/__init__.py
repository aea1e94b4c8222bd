"""The ``delayq`` command: one module per command group, assembled in ``main.py``."""

from delayq.cli.main import main
from delayq.cli.worker import load_app

__all__ = ["load_app", "main"]
