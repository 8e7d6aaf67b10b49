"""Foundations every layer may import: errors, ids, statuses, column names, redaction, the
metric registry, reason text, regex translation, time limits, heap trimming and actor
placement. Nothing here imports a module outside core (the registry finds the metric
modules by name at run time).
"""
