"""Foundations every layer may import: errors, ids, statuses, column names, stage kinds,
exit codes, run dates, redaction, the metric and engine registries, reason text, regex
translation, time limits, heap trimming and actor placement. Nothing here imports a module
outside core at run time: the registries find metric modules and engine adapters by name
(the metric registry's one type-only import of the metric base is listed in
pyproject.toml's import contract).
"""
