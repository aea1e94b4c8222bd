# Opt in to delayq's pytest plugin: the delayq_url, delayq_clock, delayq_queue and
# delayq_async_queue fixtures (a private server for the session, a virtual clock per test).
pytest_plugins = ["delayq.testing"]
