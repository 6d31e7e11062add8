"""What the command line shows: each command's report as rich tables and lines.

One module per command's report (:mod:`.pack` for ``pack``, ``pack --units`` and ``merge``;
:mod:`.stats`, :mod:`.inspect`, :mod:`.verify`, :mod:`.export`), the progress bars
(:mod:`.progress`) and the consoles (:mod:`.console`). The library never imports them; the
CLI imports each inside the command that uses it, so ``packtool --help`` loads no rich.
"""
