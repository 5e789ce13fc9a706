"""Sources of the pipeline: the live kernel (with /proc sampling) and replayed recordings."""
