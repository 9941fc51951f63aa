"""The liveness limit: seconds of silence after which a peer is lost, from the option or the variable.

Read by the ranks (``initialize(liveness=...)``) and by ``idist run --liveness``, which passes it
on in ``IDIST_LIVENESS``; no torch here, so the launcher stays light.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ._errors import LaunchEnvironmentError

#: seconds of silence after which a peer is lost, unless the option or the variable says
DEFAULT_LIMIT = 30.0
LIVENESS_VAR = "IDIST_LIVENESS"


def limit_from(value: float | None, env: Mapping[str, str]) -> float:
    """The limit in seconds (0: liveness off) from ``liveness=``, else ``IDIST_LIVENESS``, else 30."""
    if value is None:
        text = env.get(LIVENESS_VAR, "").strip()
        if not text:
            return DEFAULT_LIMIT
        try:
            value = float(text)
        except ValueError:
            raise LaunchEnvironmentError(
                f"{LIVENESS_VAR}={text!r} is not a number of seconds (0 turns liveness off)"
            ) from None
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"liveness must be a number of seconds >= 0 (0 turns it off), got {value!r}")
    return float(value)
