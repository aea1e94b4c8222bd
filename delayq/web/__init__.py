"""What delayq's two web front ends share: the HTTP API (``delayq.http``) and the dashboard
(``delayq.dashboard``).

- ``tokens.py``: the bearer token, checked once at start-up and on every request;
- ``problems.py``: RFC 9457 problem details, the form of every refusal the API makes and
  of those the serving layer makes for both;
- ``serve.py``: uvicorn with bounds on slow clients and connections (``Limits``), the URL
  announced once the server listens; ``protocol.py`` is its HTTP/1.1 protocol.

Importing this package needs no extra; ``serve.py`` imports uvicorn only when it serves.
"""
