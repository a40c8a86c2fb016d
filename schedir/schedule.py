"""The base :class:`Schedule` (an op sequence, ``meta`` and a versioned JSON format).

Defined in :mod:`schedir.chain.schedule` (a chain schedule is the base of every kind's
schedule); this module names it for code that reads ``schedir.schedule``.
"""

from schedir.chain.schedule import FORMAT, VERSION, Schedule, as_ops, normalized_meta

__all__ = ["FORMAT", "VERSION", "Schedule", "as_ops", "normalized_meta"]
