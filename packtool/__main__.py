"""``python -m packtool``: the command line, as the ``packtool`` script runs it."""

from .cli import main

if __name__ == "__main__":
    main()
