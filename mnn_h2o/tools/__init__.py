"""Command-line tools run with ``python -m mnn_h2o.tools.<name>``."""
