"""``python -m aiq``."""

from .cli import main

main()
