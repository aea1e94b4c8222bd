"""Integrations with other libraries, each behind its own pip extra."""
