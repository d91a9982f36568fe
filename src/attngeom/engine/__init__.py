"""attngeom.engine: the window engine: the runner, streaming, analyses, the run commands."""
