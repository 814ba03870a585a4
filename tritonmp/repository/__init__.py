"""Model configuration, before anything is served: config.pbtxt parsed, auto-completed and checked
(config.py), checked against the model's own tensors (model_io.py, onnx_graph.py), GPU support,
warmup inputs, and `tritonmp check` (check.py)."""
