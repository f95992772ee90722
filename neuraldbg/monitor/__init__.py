"""The training monitor: hooks and device-side statistics (see ``monitor.py``)."""
