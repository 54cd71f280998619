"""Analysis of the records on disk, apart from the runtime (which never imports it).

``results`` loads every run into one table, ``stats`` gives paired statistics, ``variants``
labels method variants, ``spec`` and ``render`` are the table language and its output,
``papers`` the catalogue of the papers' tables, ``figures`` theirs, ``report`` a one-line
summary per run, ``diagnostics`` the rank-trace readers. ``python -m harness.analysis`` is
``make tables``.
"""
