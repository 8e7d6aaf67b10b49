"""One run from config to committed tables: the plan (:mod:`.plan`), the Ray Data pipeline
(:mod:`.runner`), the manifest (:mod:`.manifest`), the dry run and its text
(:mod:`.dry_run`, :mod:`.dry_run_text`), local Ray start-up (:mod:`.ray_paths`) and the
query printed after a run (:mod:`.query_hint`).
"""
