"""Training phases: the shim `fdtrace run` injects, the explicit `phase()` API, and the phases
table of recordings."""

from fdtrace.integrations.phases.api import phase

__all__ = ["phase"]
