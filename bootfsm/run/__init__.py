"""One run session around the engine: lock, journal, signals, checkpoint, sd_notify,
metrics and guest-agent events."""
