"""``delayq worker APP --processes N``: a supervisor process and N worker processes.

``supervisor.py`` starts, restarts and stops the worker processes; ``child.py`` is what a
worker process does when a supervisor started it (report ready, follow its parent);
``metrics.py`` serves the children's Prometheus metrics on one port.
"""
