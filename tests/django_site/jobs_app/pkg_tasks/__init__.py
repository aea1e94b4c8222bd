"""A tasks *package* (found with TASKS_MODULE = "pkg_tasks"): its handlers are declared in
the submodules it imports, none at its top level."""

from . import mail  # noqa: F401
