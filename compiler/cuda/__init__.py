"""CUDA compilation (NVRTC, offline or through CuPy), the kernel cache, and the CuPy runtime.

Nothing here imports CuPy at module import time: CPU-only machines never need it.
"""
