"""Operating runs: nightly runs and their outcome text (:mod:`.nightly_job`,
:mod:`.nightly_summary`), Ray job submission (:mod:`.submit`) and the files shipped with
a job (:mod:`.shipping`).
"""
