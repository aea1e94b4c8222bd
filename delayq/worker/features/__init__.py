"""The worker's features, each an extension (:class:`~delayq.worker.lane.Extension`)
plugged into a lane by a decorator of the Worker: periodic schedules (``cron.py``:
``@worker.cron``, ``@worker.every``) and expiring keys (``expiring.py``: ``@worker.on_expire``;
``bells.py``, their notifications on each primary of a cluster). Their pure parts live in
the feature packages, ``delayq/cron/`` and ``delayq/expiring/``. Nothing here is imported
until a worker declares the feature (``cron.py`` loads croniter)."""
