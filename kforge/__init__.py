"""kforge: LLM-written accelerator kernels, proven correct and timed against PyTorch."""

__version__ = "0.1.0"
