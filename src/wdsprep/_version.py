"""The package's own version: `wdsprep.__version__`, and what `wdsprep --version` says when no
installed distribution's metadata gives one."""
__version__ = "0.1.0"
