"""The frontend's side of the worker processes: the socketpair protocol, shared-memory arenas, the instance pools."""
