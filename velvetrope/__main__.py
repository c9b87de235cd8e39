"""``python -m velvetrope`` runs the command-line interface."""

from velvetrope.cli import main

main()
