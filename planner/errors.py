"""The one root exception of plantune: a user-facing problem with its fix.

CLI entry points catch :class:`PlantuneError`, print its single line and exit 2;
library code raises it instead of calling ``sys.exit``.
"""

from __future__ import annotations


class PlantuneError(Exception):
    """A problem the user can fix; ``str(err)`` is one line naming it and the fix."""


class InputError(PlantuneError):
    """Bad input: unknown model or GPU, malformed file, impossible numbers."""


class DoesNotFitError(PlantuneError):
    """No configuration of the space fits the cluster's memory."""
