"""`import tritonfrontend`: tritonmp's network frontends for the in-process server under Triton's
name (see tritonmp.as_triton)."""

import tritonmp.tritonfrontend
from tritonmp.as_triton import alias

alias(__name__, tritonmp.tritonfrontend)
