"""One module per ``bkaudit`` command (or family of commands): its flags and its run function.

Each is declared once in :mod:`jobs.cli.registry`; ``jobs/audit.py`` and ``jobs/rereplicate.py``
are the ``spark-submit`` entry points into :mod:`jobs.commands.audit` and
:mod:`jobs.commands.repair`.
"""
