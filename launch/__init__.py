"""Launchers: local multi-process workers, cluster job-script generators, build scripts."""
