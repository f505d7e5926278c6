"""The operator's log (shell/runner.py, configure_logging): kopf's line
per watch event left out unless --verbose."""

import logging

from inferentia_operator.shell.runner import configure_logging


def test_kopfs_line_per_event_is_left_out_and_its_warnings_kept():
    configure_logging(verbose=False)
    objects = logging.getLogger("kopf.objects")
    assert not objects.isEnabledFor(logging.INFO)  # "Handler 'on_pod' succeeded."
    assert objects.isEnabledFor(logging.WARNING)
    configure_logging(verbose=True)
    assert objects.isEnabledFor(logging.DEBUG)
    objects.setLevel(logging.NOTSET)
