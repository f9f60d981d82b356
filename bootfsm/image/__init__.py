"""Image builds: bake."""
