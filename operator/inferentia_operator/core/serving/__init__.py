"""Serving: the serving Deployment (a LeaderWorkerSet when a replica spans nodes), what each of its
processes runs, the Service, PodDisruptionBudget, NetworkPolicy and plan ConfigMap around it, and the part.
"""
