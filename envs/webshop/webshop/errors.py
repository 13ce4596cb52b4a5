"""Errors of the webshop package that callers may report as one line."""


class DataFileError(ValueError):
    """A WebShop data file that cannot be read as what it should be; the message names it and the fix."""
