"""The operator shell: everything that talks to the API server.

The watch caches, the work queue, the act step (server-side apply of what differs),
the reconcile loop and its triggers, the kopf wiring, the API client and the metrics.
Each reconcile asks :mod:`inferentia_operator.core` what to do and does only that.
"""
