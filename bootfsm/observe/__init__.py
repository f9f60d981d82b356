"""The journal and everything that reads it back: trace, its views, the fleet view,
liveness, OpenTelemetry export.
"""
