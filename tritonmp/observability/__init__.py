"""What the server tells about itself: metrics, statistics, traces, logging settings, systemd notifications."""
