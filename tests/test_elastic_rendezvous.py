"""The rendezvous that elastic agents share (torch's c10d rendezvous, as idist configures it).

Two agents' handlers in this process, on a loopback endpoint: the first runs a round alone, then
stops beating for a while, as the agent of a running job may on a loaded machine.
"""

from __future__ import annotations

import threading
import time

from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousHandler
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from elastic_checks import free_port
from idist.launch._agent import KEEP_ALIVE, KEEP_ALIVE_MISSED, rendezvous_params
from idist.launch._elastic import ElasticPlan

#: seconds the running agent goes without a heartbeat: more than the 3 s that once dropped it
SILENT = 4.0


def test_a_running_agent_that_misses_a_few_heartbeats_keeps_its_round() -> None:
    """A node that comes to join waits for the running one to let it in (a restart) instead of
    starting a round of its own beside the job (seen in CI: both nodes then waited forever)."""
    assert KEEP_ALIVE * KEEP_ALIVE_MISSED > 2 * SILENT
    plan = ElasticPlan(1, 2, 1, 0, f"127.0.0.1:{free_port()}", 60.0)
    running = rdzv_registry.get_rendezvous_handler(rendezvous_params(plan, 1.0))
    running.next_rendezvous()  # a round of one node, the job's
    running._stop_heartbeats()  # type: ignore[attr-defined]
    time.sleep(SILENT)
    joining = rdzv_registry.get_rendezvous_handler(rendezvous_params(plan, 1.0))
    ended: list[object] = []

    def join(handler: RendezvousHandler) -> None:
        try:
            ended.append(handler.next_rendezvous().rank)
        except RendezvousClosedError as exc:
            ended.append(exc)

    thread = threading.Thread(target=join, args=(joining,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while running.num_nodes_waiting() == 0 and not ended and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended == [] and running.num_nodes_waiting() == 1, ended
    finally:
        running.shutdown()  # the joining node's wait ends: the rendezvous is closed
        thread.join(30)
    assert len(ended) == 1 and isinstance(ended[0], RendezvousClosedError), ended
