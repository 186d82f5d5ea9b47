"""Gateway settings: the one place where the gateway reads environment variables.

Every field can be set by an environment variable named
`PAGEDWEIGHT_GATEWAY_<FIELD>` (upper case), e.g. `PAGEDWEIGHT_GATEWAY_PORT=8000`;
`python -m gateway` flags override them. `API_KEYS` is a comma-separated list.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "PAGEDWEIGHT_GATEWAY_"


class GatewaySettings(BaseSettings):
    """Validated once at start-up and passed down explicitly (immutable)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Interface the HTTP server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free one.")
    dataplane: str = Field(
        "127.0.0.1:50051", min_length=1, description="host:port of the dataplane's Inference gRPC service."
    )
    api_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Accepted bearer keys; empty means no authentication."
    )
    max_concurrent_requests: int = Field(
        256, ge=1, description="Dataplane sequences generating at once: a request takes one per choice "
        "(prompts x n); one asking for more runs alone."
    )
    max_queued_requests: int = Field(
        1024, ge=0, description="Requests waiting for a slot; beyond this the gateway answers 429."
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After (seconds) sent with 429 answers.")
    request_timeout_s: float = Field(
        600.0, gt=0, description="Deadline of one request: queueing plus generation."
    )
    dataplane_wait_s: float = Field(
        10.0, gt=0, description="How long a request waits for an unreachable dataplane before 503."
    )
    dataplane_outages: int = Field(
        3, ge=0, description="Times one sequence may lose the dataplane mid-request and be continued "
        "once it answers again (0: the first loss fails the request)."
    )
    model_name: str | None = Field(
        None, description="Name served in the OpenAI 'model' field instead of the dataplane's."
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        """Accepts 'k1,k2' (from the environment) as well as a sequence."""
        if isinstance(value, str):
            return tuple(key.strip() for key in value.split(",") if key.strip())
        return value

    @field_validator("api_keys")
    @classmethod
    def _no_blank_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not key.strip() for key in value):
            raise ValueError("API keys must be non-blank")
        return value
