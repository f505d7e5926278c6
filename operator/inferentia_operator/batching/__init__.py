"""The batching front end a serving pod runs beside its model processes (no kopf in here).

See :mod:`.dispatch` (when to send which batch where), :mod:`.padding` (buckets) and
:mod:`.frontend` (the HTTP server).
"""
