"""Ground floor: the exit-code table, errors, the config spec, redaction, deadlines,
architecture names and the hardware knowledge table. Imports nothing above it.
"""
