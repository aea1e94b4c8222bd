"""``delayq demo``: unpaid orders closed on time, once, with stock restored."""

from delayq.demo.run import DemoConfig, run_demo

__all__ = ["DemoConfig", "run_demo"]
