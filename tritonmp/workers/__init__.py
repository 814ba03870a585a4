"""Code that runs inside a worker process: the worker loop and one module per backend."""
