"""Artifact resolution, the verified cache and the parallel fetcher."""
