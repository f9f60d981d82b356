"""The journal and its readers: trace and its views, the fleet view, liveness, OTLP export."""
