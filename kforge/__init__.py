"""kforge: LLM-written accelerator kernels, proven correct and timed against PyTorch."""

import os

# torch's profiler (kineto) prints two lines each time it starts and stops; kforge records the ops
# of every reference with it (tasks/trusted.py), so keep them off users' terminals.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__version__ = "0.1.0"
