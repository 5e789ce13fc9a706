"""`fdtrace rehearse`: a DDP-shaped connection load against a balancer, traced while it runs.

``shape`` says what is opened when (ranks, connections per rank, bursts, ramp steps);
``connections`` opens one rank's connections at one instant and ``ranks`` runs the ranks as
threads of this process or as processes of their own; ``target`` finds what to trace (the
process listening on the target port, on this host or in one of its network namespaces);
``watch`` is the pipeline sink that sees the target fail; ``runner`` plays the bursts; ``result``
turns what was measured into the figures and the doctor's recommendation.

The package root imports nothing: a rank process (``python -m fdtrace.rehearsal.rank``) loads
only the standard library.
"""
