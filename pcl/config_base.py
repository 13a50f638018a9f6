"""The base of every config section and the configuration's error (`pcl.config_schema` builds the tree on them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names each bad key and where it came from."""


Resources = dict[str, Annotated[float, Field(gt=0)]]  # custom Ray resources an actor needs: {name: amount}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
