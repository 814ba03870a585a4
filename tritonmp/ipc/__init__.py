"""The wire between the frontend and its worker processes: the socketpair protocol and its channel,
buffers, shared-memory arenas, clients' registered regions, the batch codec, busy polling, and the
worker templates' protocol."""
