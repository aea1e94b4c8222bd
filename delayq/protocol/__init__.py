"""Protocol v1: what a producer in any language needs (docs/protocol.md), versioned.

``version`` holds the version this delayq speaks and the rule for meeting another;
``export`` writes the producer's scripts and their manifest (``delayq protocol export``).
"""
