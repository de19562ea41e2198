"""``python -m dueq``: the ``dueq`` command line."""

from dueq.cli import main

if __name__ == "__main__":
    main()
