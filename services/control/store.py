"""One run's whole control state: what the driver holds (it resets or restores the state, then serves the API
over it), and what the tests drive both sides of."""

from __future__ import annotations

from services.control.requests import ControlRequests
from services.control.writes import ControlWrites


class ControlStore(ControlRequests, ControlWrites):
    """The reader, the API's requests and the driver's and coordinator's writes over the same keys."""
