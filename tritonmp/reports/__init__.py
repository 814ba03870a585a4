"""What the server reports of itself, read from its served versions: the Prometheus metrics and the
status document behind the status page."""
