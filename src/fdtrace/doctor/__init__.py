"""`fdtrace doctor`: checks of the limits that decide FD exhaustion and thread explosions, with
the value to set and the exact change, for processes and for the system."""
