"""The model repository: configs, their checks, model I/O and auto-complete, the model manager, warmup."""
