"""`import tritonserver`: tritonmp's in-process API under Triton's name (see tritonmp.as_triton)."""

import tritonmp.tritonserver
from tritonmp.as_triton import alias

alias(__name__, tritonmp.tritonserver)
