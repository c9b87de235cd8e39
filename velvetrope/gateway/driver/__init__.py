"""The gateway's admission driver: the request machine's asyncio driver (the ticket), the
leases it takes from the store, the budgets and ledger at the reservation and settlement."""

__all__: list[str] = []
