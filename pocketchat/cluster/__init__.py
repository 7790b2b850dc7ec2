"""Replicas: one coordinator for one process or for several, through Redis."""
