"""The base of every config section and the configuration's error (`pcl.config_schema` builds the tree on them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names each bad key and where it came from."""


Resources = dict[str, Annotated[float, Field(gt=0)]]  # custom Ray resources an actor needs: {name: amount}


class Section(BaseModel):
    # strict: no value changes type on its way in, as in the control plane's API (services/control/models.py): a
    # bool is not a count, a quoted "0.4" is not a number, 1 is not `true`. Pydantic's strict mode still takes an
    # int for a float field (`lr: 1`), which loses nothing. YAML and command-line values arrive typed
    # (pcl.config reads them as YAML, exponent floats such as 8e-06 included); no field is a tuple, so the JSON
    # form a run writes (lists, strings) validates back as it is.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)
