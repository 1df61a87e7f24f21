"""``python -m tunecache.cli``: the same command as the ``tunecache`` script."""

from tunecache.cli import main

main()
