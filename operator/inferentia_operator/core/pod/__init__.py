"""What every feature's objects share, below the features: the :class:`model.Model` each builder
and part takes, the labels, selectors and owner of every child, and the pod's common pieces
(security contexts, scratch volumes, the operator's own fetch containers, the node cache's
token and views, sized volumes, affinity, ports), with :class:`part.Part`, what each part returns.

Each builder returns the exact body the operator server-side applies, so tests can check every
child field against the plan without a cluster, and the controller can compare what it would
apply with what is live before writing anything. Nothing here imports a feature package
(tests/test_import_directions.py).
"""
