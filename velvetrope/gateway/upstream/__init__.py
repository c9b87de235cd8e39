"""The gateway's engines and upstreams: picking one, forwarding and relaying a request,
scraping engines' metrics, the priority field in each engine's reading, where a stored
response lives."""

__all__: list[str] = []
