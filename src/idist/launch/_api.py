"""``idist.launch``'s public names, imported together on first use (see ``idist._lazy``)."""

from __future__ import annotations

from .._detect import launched_by as launched_by
from .._errors import (
    LaunchConfigError as LaunchConfigError,
    LaunchError as LaunchError,
)
from ._handle import SpawnHandle as SpawnHandle
from ._parallel import Parallel as Parallel
from ._plan import StartMethod as StartMethod
from ._ports import (
    PortReservation as PortReservation,
    reserve_port as reserve_port,
)
from ._spawn import spawn as spawn
