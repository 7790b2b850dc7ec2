"""PocketChat's app around the flow: the web side, the stores, the providers, the replicas.

main.py wires these parts; flow.py and nodes.py (at the top level) are what a turn runs.
"""
