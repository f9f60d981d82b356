"""bootfsm: GPU node provisioning as an explicit finite-state machine."""

__version__ = "0.1.0"
__all__ = ["__version__"]
