"""The request and response bodies of the control plane's API (services/control/api.py): what /openapi.json
states of each."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _params_schema(schema: dict[str, Any]) -> None:
    """ParamsUpdate's schema states every rule of the body: a field is a number, never null (absent: the run's
    value stands), and at least one is given."""
    for field in schema["properties"].values():
        field.pop("default", None)
    schema["minProperties"] = 1


class ParamsUpdate(BaseModel):
    """New selection parameters, applied from the next step on: tau, k or both. Read strictly: a JSON boolean,
    a string or null is no number; k is a number with no fractional part (8, or 8.0 as JSON Schema has it)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_params_schema)
    # None: absent (defaults are not validated, and null itself is refused)
    tau: float = Field(None, ge=0, le=1, allow_inf_nan=False, description="Target pass rate, in [0, 1].")
    k: int = Field(None, ge=1, description="Candidate pool factor, an integer >= 1; at most the run's k_max "
                   "(GET /v1/status), else 409.")

    @field_validator("k", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        """8.0 is the integer 8 by the schema (JSON Schema's `integer`); 8.5, true and "8" stay refused."""
        return int(value) if type(value) is float and value.is_integer() else value

    @model_validator(mode="after")
    def _something_to_change(self) -> "ParamsUpdate":
        if self.tau is None and self.k is None:
            raise ValueError("give tau and/or k")
        return self


class StaleReading(BaseModel):
    """What makes an answer stale: Redis was unreachable, so the read answered from its last good reading."""

    reason: str = Field(description="Why the answer is not fresh, e.g. 'Redis unreachable (ConnectionError): the "
                        "last good reading'.")
    age_s: float = Field(description="Seconds since the reading was taken.")
    as_of: float = Field(description="Unix time the reading was taken.")


STALE_DESCRIPTION = ("null while Redis answers; while it is unreachable (a restart: the embedded Redis is back "
                     "within seconds) the answer is the last good reading, and this says how old it is.")


class HistoryPage(BaseModel):
    records: list[dict[str, Any]] = Field(description="Step records, oldest first.")
    more: bool = Field(False, description="Later records remain: ask again with after= the last record's step.")
    stale: StaleReading | None = Field(None, description=STALE_DESCRIPTION)


class Event(BaseModel):
    id: str = Field(description="Stream id; pass it as ?after= to read what came later.")
    type: str = Field(
        description="pause_requested, paused, resume_requested, resumed, params_requested, "
        "params_applied, params_refused, checkpoint_requested, checkpoint_written, finished"
    )
    source: str = Field(description="'api' for requests, 'coordinator' for what it applied.")
    time: float = Field(description="Unix time.")
    step: int | None = Field(description="Coordinator events: the first step that ran with the change.")
    data: dict[str, Any]


class Accepted(BaseModel):
    accepted: bool = True
    event: Event


class CheckpointAccepted(BaseModel):
    accepted: bool = True
    request_id: str
    requested_at: float
    note: str = "recorded; the coordinator sees it at the next step boundary"


class RunStatus(BaseModel):
    """The run as the coordinator last published it, with what is asked for and live queue depths."""

    model_config = ConfigDict(extra="allow")
    run: str
    state: str = Field(description="waiting, running, pausing, paused, resuming, finished, failed or lost.")
    step: int = Field(description="Training steps completed.")
    policy_version: int | None = None
    paused: bool = False
    pause_requested: bool = False
    tau: float | None = None
    k: int | None = None
    last_step: dict[str, Any] | None = Field(None, description="The last step's metrics record.")
    queue_depths: dict[str, int]
    actors: dict[str, str] | None = Field(None, description="Health of each actor at the last step.")
    coordinator: dict[str, Any]
    stale: StaleReading | None = Field(None, description=STALE_DESCRIPTION)
