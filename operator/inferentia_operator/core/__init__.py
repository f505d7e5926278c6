"""The pure core: what a model means and what the operator would do about it.

API models, the catalogue of Neuron families, the rules, the planner, the builders of
the objects a model owns, the reconcile's decision and its status. Nothing in this
folder talks to Kubernetes: kopf and the Kubernetes client are banned here as a whole
(pyproject.toml's ruff config, and tests/test_lint.py imports every module to be sure),
so each piece is a function of its inputs, tested without a cluster.
"""
