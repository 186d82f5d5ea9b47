"""Bearer API keys. With no keys configured every request is accepted."""

from __future__ import annotations

import hmac

from gateway.errors import unauthorized

BEARER = "bearer"


class ApiKeyAuth:
    """Checks `Authorization: Bearer <key>` against the configured keys in
    constant time per key (no timing hint about which prefix matched)."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = tuple(key.encode() for key in keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: str | None) -> None:
        """Returns when the header carries a valid key; raises a 401 APIError."""
        if not self._keys:
            return
        if not authorization:
            raise unauthorized("Missing API key: send the header 'Authorization: Bearer <key>'.")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != BEARER or not token.strip():
            raise unauthorized("Malformed Authorization header: expected 'Bearer <key>'.")
        candidate = token.strip().encode()
        # Compare against every key (no early exit) to keep timing uniform.
        matches = [hmac.compare_digest(candidate, key) for key in self._keys]
        if not any(matches):
            raise unauthorized("Incorrect API key provided.")
