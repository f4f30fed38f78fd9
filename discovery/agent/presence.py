"""The agent's node in ZooKeeper, as its policy wants it: admitted, left, drained.

Design: docs/design/data-server.md, "The agent".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from discovery.agent.policy import HealthPolicy
from discovery.errors import DiscoveryError, InvalidInstanceError, ZkError
from discovery.instance import InstanceState, ServiceInstance
from discovery.metrics import AgentMetrics
from discovery.zk.registration import Registration

__all__ = ["Presence"]

log = logging.getLogger(__name__)


class Presence:
    """Carry the registration state machine out: register on admission, announce a
    departure and delete the node, drain, take offline and bring online on request,
    publish a new version of the instance. It owns the instance as registered.

    The policy decides, the presence acts (on the agent's loop only), then calls
    ``on_change`` so that the status follows. ZooKeeper errors are logged, never
    raised: the :class:`~discovery.zk.registration.Registration` keeps trying. The
    registration is :meth:`attach`-ed once the agent's session is open; acting
    before that is a programming error.
    """

    def __init__(
        self,
        instance: ServiceInstance,
        policy: HealthPolicy,
        *,
        drain_grace: float,
        metrics: AgentMetrics,
        on_change: Callable[[], None],
    ) -> None:
        self._instance = instance
        self._policy = policy
        self._drain_grace = drain_grace
        self._metrics = metrics
        self._on_change = on_change
        self._registration: Registration | None = None

    @property
    def instance(self) -> ServiceInstance:
        """The instance as last registered, or to be."""
        return self._instance

    @property
    def registration(self) -> Registration | None:
        """Our registration, once attached."""
        return self._registration

    def attach(self, registration: Registration) -> None:
        """Act through ``registration`` (made on the agent's session, once it is open)."""
        self._registration = registration

    def show_state(self) -> None:
        """The state metric follows the policy's state (after every change of it)."""
        self._metrics.state.state(self._policy.state.value)

    async def admit(self, why: str | None) -> None:
        """Register (again): the policy admitted the server; ``why`` is logged."""
        assert self._registration is not None
        self.show_state()
        # Every admission is a new registration: serving again (an announced departure
        # left "draining" behind) and stamped now, so that search servers treat the
        # server as a fresh target rather than as the one they ejected before it left.
        instance = dataclasses.replace(
            self._instance.with_state(InstanceState.SERVING),
            registration_time_utc=int(time.time() * 1000),
        )
        try:
            await self._update_instance(instance)
        except DiscoveryError as exc:
            log.error("updating %s before registering failed: %s", self._instance.id, exc)
        try:
            await self._registration.register()
        except ZkError as exc:
            # The registration keeps trying (at reconnect, or when a conflicting
            # node goes); our intent is recorded, the error is not ours to raise.
            log.error("registering %s failed for now: %s", self._instance.id, exc)
        else:
            if why:
                log.info("%s registered (%s)", self._instance.id, why)

    async def leave(self, reason: str | None) -> None:
        """Announce the departure the policy decided and delete our node."""
        assert self._registration is not None
        self.show_state()
        # A registration in flight (an admin request can arrive during one) is waited
        # for: its node may already be seen, and must be announced like any other.
        if await self._registration.settled():
            # Announce the departure before the node goes: readers stop routing at the
            # first write, and the leader knows this removal is deliberate, not one of
            # the unexplained vanishings its mass-loss brake holds back.
            leaving = self._instance.with_state(InstanceState.DRAINING, reason=f"offline: {reason}")
            try:
                await self._update_instance(leaving)
            except DiscoveryError as exc:
                log.warning("announcing %s offline failed: %s", self._instance.id, exc)
        try:
            await self._registration.deregister()
        except ZkError as exc:
            log.error("deregistering %s failed for now: %s", self._instance.id, exc)

    async def take_offline(self, reason: str) -> None:
        """Leave on request, until :meth:`bring_online` (nothing once draining)."""
        if not self._policy.take_offline(reason):
            return
        log.info("taking %s offline on request: %s", self._instance.id, reason)
        self._on_change()  # the new state shows at once, not once the node has gone
        await self.leave(reason)
        self._on_change()

    def bring_online(self) -> bool:
        """Undo :meth:`take_offline`: True if the policy now waits for a good probe."""
        if not self._policy.bring_online():
            return False
        self.show_state()
        return True

    async def accept_update(self, instance: ServiceInstance) -> None:
        """Publish the caller's ``instance``, keeping what the agent owns (its state and
        reason, ``enabled``, the registration time); raises
        :class:`~discovery.errors.InvalidInstanceError` for another id."""
        current = self._instance
        if instance.id != current.id:
            raise InvalidInstanceError(
                f"update_instance: id {instance.id!r} is not this agent's ({current.id!r})"
            )
        payload = dataclasses.replace(
            instance.payload, state=current.payload.state, reason=current.payload.reason
        )
        await self._update_instance(
            dataclasses.replace(
                instance,
                payload=payload,
                enabled=current.enabled,
                registration_time_utc=current.registration_time_utc,
            )
        )

    async def _update_instance(self, instance: ServiceInstance) -> None:
        assert self._registration is not None
        self._instance = instance
        await self._registration.update(instance)

    async def drain(self, grace: float | None) -> None:
        """Mark our node draining, wait ``grace`` (default: the configured one), then
        delete it (once only: nothing after the first drain or a stop, so where the
        node goes by ending the session, the session is closed for good)."""
        assert self._registration is not None
        if not self._policy.drain():
            return
        grace = self._drain_grace if grace is None else grace
        self.show_state()
        self._on_change()
        log.info("draining %s (grace %gs)", self._instance.id, grace)
        # Settled, not merely "registered": while a create was on its way that read
        # False, and the node it made went without the mark and the grace.
        if await self._registration.settled():
            draining = self._instance.with_state(InstanceState.DRAINING, reason="draining")
            try:
                await self._update_instance(draining)
            except DiscoveryError as exc:
                log.error("marking %s draining failed: %s", self._instance.id, exc)
            # The grace period is the contract with the search servers: they stop
            # routing to a draining node within it, while we keep answering.
            await asyncio.sleep(grace)
        try:
            await self._registration.deregister(final=True)
        except ZkError as exc:
            log.error("deregistering %s after drain failed: %s", self._instance.id, exc)
        log.info("%s drained", self._instance.id)

    async def stop(self, *, session_closing: bool) -> None:
        """The agent stops: the policy is finished, the registration closed (its node
        deleted unless ``session_closing`` takes it along)."""
        self._policy.stop()
        self.show_state()
        if self._registration is not None:
            await self._registration.aclose(session_closing=session_closing)
