"""tritonmp: a Triton-compatible inference server."""

__version__ = "0.1.0"
