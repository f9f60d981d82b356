"""The I/O boundary: node files and commands (host), HTTP (http, http_wire), the node lock,
.part files, safe archive rules, download progress.
"""
