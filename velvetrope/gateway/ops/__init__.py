"""The gateway's operations: its metrics and counters, configuration reload, and the
usage ledger's reports."""

__all__: list[str] = []
