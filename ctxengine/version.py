"""The package's version, in a module of its own at the bottom of the layers, so
that what reports it (``ctx --version``, the servers) need not import the
package root, which loads the layers above them."""

__version__ = "0.1.0"
