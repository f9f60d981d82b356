"""One run session: lock, journal, signals, checkpoint, sd_notify, metrics and guest-agent
events around the engine.
"""
