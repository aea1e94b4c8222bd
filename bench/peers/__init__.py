"""delayq next to its peers (arq, RQ, Dramatiq, Celery, Huey, SAQ, a bare Lua floor).

``bench/peers/run`` runs them one at a time against fresh private servers; see
``bench/README.md`` and ``docs/benchmarks.md``.
"""
