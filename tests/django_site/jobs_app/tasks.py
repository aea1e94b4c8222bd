"""Celery's module, say: delayq looks here only while TASKS_MODULE is "tasks" (the default),
and finds no declaration in it."""


def celery_task() -> None:
    pass
