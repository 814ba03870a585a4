"""The network frontends: HTTP/REST (uvicorn with our protocol class) and gRPC (our own
HTTP/2), their codecs, and what guards them."""
