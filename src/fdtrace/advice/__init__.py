"""What to change, computed once: pure rules (no I/O, no rendering) that take what was measured
or read (a peak, a need, the limits in force and where each was set, a program's own
configuration) and return a ``Change`` (``change.py``), and the models of programs that size
themselves, each with its own arithmetic: HAProxy (``haproxy.py``) and nginx (``nginx.py``).
doctor, info, the report, the live view and rehearse render what these return."""
