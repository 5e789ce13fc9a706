"""The Textual interface (the only package that imports textual)."""
