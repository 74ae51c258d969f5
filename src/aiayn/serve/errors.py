"""A request the server refuses, with the field it concerns (OpenAI's error object names it as ``param``)."""

from __future__ import annotations

from aiayn.local_server import BadRequest


class RequestError(BadRequest):
    """A request's mistake: status (400 unless said), message and the field it concerns."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(status, message)
        self.param = param
