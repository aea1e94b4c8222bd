"""Runnable examples of delayq (see examples/README.md), each tested in tests/test_examples.py."""
