"""`python flow.py --with batch|kubernetes torch-distributed preflight`: checks that a remote
backend can run a gang before a run spends its queue time (common, batch, kubernetes, smoke,
and the CLI). Imports the backends and everything below them.
"""
