"""Simulated GPU node: node directories, stand-in commands and a loopback mirror."""
