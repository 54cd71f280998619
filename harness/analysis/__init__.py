"""Analysis of the records on disk, apart from the runtime (which never imports it).

``results`` loads every run into one table, ``stats`` gives paired statistics, ``variants``
labels method variants, ``presets`` says which runs are a preset's, ``shared`` which examples a
table's cells share, ``spec`` and ``render`` are the table language and its output, ``papers``
the catalogue of the papers' tables, ``figures`` theirs, ``report`` a one-line summary per run,
``diagnostics`` the rank-trace readers. ``python -m harness.analysis`` is ``make tables``.
"""
