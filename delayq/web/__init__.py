"""What delayq's two web front ends share: the HTTP API (``delayq.http``) and the dashboard
(``delayq.dashboard``).

- ``tokens.py``: the bearer token, checked once at start-up and on every request.

Importing this package needs no extra.
"""
