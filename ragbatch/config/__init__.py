"""The job config: its schema (:mod:`.job`), YAML read within budgets (:mod:`.safe_yaml`)
and URI templates (:mod:`.templating`).
"""
