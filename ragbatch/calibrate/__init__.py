"""``ragbatch calibrate``: how far each judge metric agrees with human labels.

Modules: :mod:`.config` (the calibration config), :mod:`.labels` (labels to numbers),
:mod:`.prepare` (the labelled input: row limit, answer pairs), :mod:`.measures`
(agreement measures and their bootstrap intervals), :mod:`.agreement` (measures per
judge and metric from a run's scores), :mod:`.output` (tables, commit, lookup),
:mod:`.text` (console table), :mod:`.guard` (the run's minimum-agreement check) and
:mod:`.command` (the whole command). ``--align`` (few-shot examples for one judge
metric): :mod:`.align` (split, choice of examples, the file's record),
:mod:`.align_replies` (each example's reply), :mod:`.align_measures` (before, after
and the change) and :mod:`.align_command` (the whole option).
"""
