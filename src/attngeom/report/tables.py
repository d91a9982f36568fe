"""Pivoting a results table for the report without ever averaging what its labels do not
tell apart (the report's sections, ``report/findings.py`` and ``report/policies.py``)."""

from __future__ import annotations


def keyed(df, index, columns, values, what: str):
    """``df`` pivoted with exactly one row per cell: a table of the report never
    averages rows its labels do not tell apart (several rows for one cell raise,
    naming the table and the keys)."""
    keys = [*index, *([columns] if isinstance(columns, str) else columns)]
    dup = df.duplicated(keys, keep=False)
    if dup.any():
        from attngeom.errors import RunDirError

        first = df.loc[dup, keys].iloc[0].to_dict()
        raise RunDirError(f"{what}: several rows for {first}; expected one per "
                          f"{', '.join(keys)}")
    return df.pivot(index=index, columns=columns, values=values)
