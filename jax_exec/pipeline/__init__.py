"""Executing pipelines over several devices: MPMD per interval, SPMD over a mesh, and
the dynamic runtime."""
