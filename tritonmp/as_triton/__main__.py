"""`python -m tritonmp.as_triton` prints the folder that serves `import tritonserver` and `import
tritonfrontend` with tritonmp's packages."""

from . import path

print(path())
