"""Steps the states share with image builds: dpkg, units, the driver's install and
per-boot init, CDI, containerd wiring, the prebake marker.
"""
