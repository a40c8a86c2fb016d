"""Typed errors of the IR. Both subclass ``ValueError`` so callers may catch either."""


class InvalidProblem(ValueError):
    """A problem description (chain, graph, platform) is malformed.

    The message names the field, the index and the offending value.
    """


class InvalidSchedule(ValueError):
    """A schedule cannot run on its problem.

    The message names the op index, the op and the missing (or duplicate) buffer.
    """
