"""Data shipped with velvetrope (built-in traces under ``traces/``)."""
