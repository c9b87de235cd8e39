"""Bounded harnesses that try the product as an SRE would: ``make chaos`` (Redis, engine and
gateway faults under load), ``make fuzz`` (schema-aware request fuzzing) and ``make soak``
(an hour of load, resources sampled).  Each starts real processes on loopback, stops them
itself, and ends with a one-line verdict and an exit status (0 when every invariant held).
"""
