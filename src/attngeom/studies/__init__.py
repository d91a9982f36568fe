"""attngeom.studies: runs of several commands, models and corpora, and their one report.

The layer above the pipeline and the report: it runs cells through the common runner
and builds reports from their results directories.
"""
