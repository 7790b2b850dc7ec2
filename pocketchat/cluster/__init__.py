"""Replicas: one coordinator for one process (`local.py`) or for several, through Redis (`replicas.py`)."""
