"""The pure core: what a gang is and what can go wrong, with no process, socket or Metaflow.

Topology and settings (what the decorator was given and what it infers), the rendezvous
environment's names, the gang's wire format (gangspec), failures as data, devices, the sealed
envelope of the control plane's values, errors. Imports nothing of the package but this folder.
"""
