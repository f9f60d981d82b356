"""Ground floor: codes, errors, config spec, hardware knowledge; imports nothing above it."""
