"""``cptrace profile``: profile the user's own job (nsys per rank, PyTorch profiler, probe).

Launcher side: ``command`` (command lines), ``run`` (the profile and its bundle), ``supervise``
(watchdog and failure record), ``facts`` (probe records -> manifest). Rank side, loaded by the
``bootstrap/sitecustomize.py`` in every child: ``rankstatus`` and ``torchprof``.
"""
