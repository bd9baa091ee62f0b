"""A dead or hung rollout server stops the run with an error naming it and the step (docs/faults.md).

A dead server fails the pending calls with a long traceback that names neither the step nor what to do; a hung one
fails nothing and verl waits forever (also in a blocking weight sync). The guards bound the wait by
`faults.generation_timeout_s` and, on a failure, ping every server (`__ray_call__`, served by any Ray actor) to raise
`RolloutServerError` listing each as alive, dead or not answering.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Awaitable, Callable, Optional, Sequence

PING_TIMEOUT_S = 10.0
SYNC_POLL_S = 2.0  # how often a running weight sync checks the servers (a ping each; a sync normally takes < 1 s)


class RolloutServerError(RuntimeError):
    """The rollout could not produce a batch: a server died or a generation outlived the timeout."""


RESUME_HINT = "The last checkpoint is intact: resume with trainer.resume_mode=auto"


def server_error(what: str, reason: str, states: Sequence[str], hint: str = RESUME_HINT) -> RolloutServerError:
    """`<what>: <reason>; rollout servers:` one line per server, then what to do."""
    return RolloutServerError(f"{what}: {reason}; rollout servers:\n  " + "\n  ".join(states) + "\n" + hint)


def _ping(actor) -> int:
    return 0


async def server_states(handles: Sequence[Any], addresses: Sequence[str], timeout_s: Optional[float] = None) -> list[str]:
    """One line per rollout server: `<address> (actor <id>): alive | DEAD (<reason>) | NOT ANSWERING within <t> s`."""
    import ray

    timeout_s = PING_TIMEOUT_S if timeout_s is None else timeout_s

    async def one(handle, address):
        label = f"{address} (actor {handle._actor_id.hex()[:12]})"
        try:
            await asyncio.wait_for(handle.__ray_call__.remote(_ping), timeout_s)
            return f"{label}: alive"
        except asyncio.TimeoutError:
            return f"{label}: NOT ANSWERING within {timeout_s:g} s"
        except ray.exceptions.RayActorError as e:
            return f"{label}: DEAD ({type(e).__name__})"
        except Exception as e:  # noqa: BLE001 - reported, not raised
            return f"{label}: error {type(e).__name__}: {e}"

    return list(await asyncio.gather(*(one(h, a) for h, a in zip(handles, addresses))))


def server_states_now(handles: Sequence[Any], addresses: Sequence[str]) -> list[str]:
    """`server_states` from synchronous code, also inside a running event loop (run in a thread of its own)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, server_states(handles, addresses)).result()


def generation_timeout(config) -> Optional[float]:
    value = (config.get("faults") or {}).get("generation_timeout_s")
    return float(value) if value else None


async def guard_generation(work: Awaitable, *, what: str, timeout_s: Optional[float], handles: Sequence[Any],
                           addresses: Sequence[str]) -> Any:
    """Awaits `work` (a batch's generation); a timeout or a dead server raises `RolloutServerError` naming `what`."""
    import ray

    t0 = time.time()
    try:
        if timeout_s:
            return await asyncio.wait_for(work, timeout_s)
        return await work
    except asyncio.TimeoutError:
        states = await server_states(handles, addresses)
        error = server_error(what, f"no batch after {timeout_s:g} s (faults.generation_timeout_s)", states,
                             hint="A hung server (or a generation slower than the timeout: raise it)")
        cause = None
    except ray.exceptions.RayError as e:
        states = await server_states(handles, addresses)
        if not any(": DEAD" in s for s in states) and not isinstance(e, ray.exceptions.RayActorError):
            raise
        error = server_error(what, f"a rollout server died during generation ({type(e).__name__})", states)
        cause = e
    print(f"[D-ARL] rollout failure detected at {time.time():.3f} ({time.time() - t0:.1f} s into the wait): "
          f"{str(error).splitlines()[0]}", flush=True)
    raise error from cause


def _sync_failure(what: str, states: list[str], t0: float, timeout_s: Optional[float]) -> Optional[RolloutServerError]:
    """The error a weight sync still running after `time.time() - t0` s ends with, or None to keep waiting."""
    late = bool(timeout_s) and time.time() - t0 > timeout_s
    if not late and not any(": DEAD" in s for s in states):
        return None
    reason = (f"no end after {timeout_s:g} s (faults.generation_timeout_s)" if late
              else "a rollout server died during the weight sync")
    print(f"[D-ARL] rollout failure detected at {time.time():.3f} ({time.time() - t0:.1f} s into the sync): "
          f"{what}: {reason}", flush=True)
    return server_error(what, reason, states)


def guard_weight_sync(sync: Callable[[], Any], *, what: str, timeout_s: Optional[float], handles: Sequence[Any],
                      addresses: Sequence[str], poll_s: Optional[float] = None) -> Any:
    """Runs the blocking `sync()` in a daemon thread; every `poll_s` s, a server found DEAD or a sync past `timeout_s`
    raises `RolloutServerError` naming `what` and each server's state, as does a Ray error from a server that died
    before or during the sync (the sync, not a generation, finds a server that died after its last batch). An
    abandoned thread dies with the run."""
    import ray

    finished = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = sync()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = e
        finally:
            finished.set()

    poll_s = SYNC_POLL_S if poll_s is None else poll_s
    t0 = time.time()
    threading.Thread(target=run, name="darl-weight-sync", daemon=True).start()
    while not finished.wait(poll_s):
        states = server_states_now(handles, addresses)
        error = None if finished.is_set() else _sync_failure(what, states, t0, timeout_s)
        if error is not None:
            raise error
    error = outcome.get("error")
    if isinstance(error, ray.exceptions.RayError):
        states = server_states_now(handles, addresses)
        if any(": DEAD" in s for s in states) or isinstance(error, ray.exceptions.RayActorError):
            print(f"[D-ARL] rollout failure detected at {time.time():.3f}: a server died before or during the weight "
                  "sync", flush=True)
            raise server_error(what, f"a rollout server died ({type(error).__name__})", states) from error
    if error is not None:
        raise error
    return outcome.get("value")


async def guard_weight_sync_async(work: Awaitable, *, what: str, timeout_s: Optional[float], handles: Sequence[Any],
                                  addresses: Sequence[str], poll_s: Optional[float] = None) -> Any:
    """`guard_weight_sync` for a coroutine sync (fully-async's), on the caller's loop; cancelled when a check fails."""
    task = asyncio.ensure_future(work)
    poll_s = SYNC_POLL_S if poll_s is None else poll_s
    t0 = time.time()
    while not (await asyncio.wait({task}, timeout=poll_s))[0]:
        states = await server_states(handles, addresses)
        error = None if task.done() else _sync_failure(what, states, t0, timeout_s)
        if error is not None:
            task.cancel()
            raise error
    return task.result()
