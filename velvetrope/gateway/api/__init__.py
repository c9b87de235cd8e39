"""The gateway's HTTP surface: the ASGI app and its server, the endpoints, parsing and
validation of requests, the headers of an admitted one, the client's stream."""

__all__: list[str] = []
