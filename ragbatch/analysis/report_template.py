"""The Jinja2 template of the HTML report (rendered with autoescaping on).

The page is one self-contained file: styles inline, charts as ``data:`` SVG images, no
script and no external resource. Its Content-Security-Policy allows nothing else, so a
viewer never fetches anything and text from the data can never run as code.
"""

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="ragbatch {{ version }}">
<title>ragbatch report: {{ run.name or run.run_id }} {{ run.run_id }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px; padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.25rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
h3 { font-size: 1.05rem; margin-top: 1.4rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .85rem; }
th, td { border: 1px solid #ddd; padding: .25rem .45rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
figure.chart { margin: 0; } figure.chart img { max-width: 100%; height: auto; }
.text { white-space: pre-wrap; word-break: break-word; max-width: 46rem; }
.muted { color: #777; } .note { background: #fff8e0; border-left: 4px solid #e0a030; padding: .4rem .6rem; }
.worse { color: #b00020; font-weight: 600; } .better { color: #1b7a3a; font-weight: 600; }
.hidden-pii { color: #777; font-style: italic; }
nav a { margin-right: 1rem; } .wide { overflow-x: auto; }
</style>
</head>
<body>
<h1>ragbatch report: {{ run.name or "run" }} <code>{{ run.run_id }}</code></h1>
<nav>
<a href="#metrics">Metrics</a><a href="#slices">Slices</a><a href="#statuses">Statuses</a>
{% if calibration %}<a href="#calibration">Agreement with humans</a>{% endif %}{% if comparison %}<a href="#comparison">Comparison</a>{% endif %}<a href="#worst">Worst rows</a>
</nav>
<table id="run-facts">
{% for key, value in facts %}<tr><th>{{ key }}</th><td>{{ value }}</td></tr>
{% endfor %}</table>
{% for note in notes %}<p class="note">{{ note }}</p>
{% endfor %}
{% if degenerate %}<p class="note degenerate" id="degenerate-warning">Degenerate judge results:
{% for mid in degenerate %}<code>{{ mid }}</code>{% if not loop.last %}, {% endif %}{% endfor %}.
Their means and intervals describe the judge, not the data (a constant verdict, empty
extractions, reasons that say nothing...); see the health column below and docs/judges.md,
"Judge health".</p>
{% endif %}

<h2 id="metrics">Metrics</h2>
<p>Means are over <code>ok</code> cells, with the {{ confidence_label }} intervals of the run summary
(percentile bootstrap of the mean; <code>mean_ci_method</code> in <code>summary.parquet</code> says
when a large group used the normal approximation). Pass rates (boolean metrics) come with Wilson
score intervals.</p>
<table id="metric-table">
<tr><th>metric</th><th>name</th><th>better</th><th>cells</th><th>ok</th><th>mean</th><th>{{ confidence_label }} interval</th><th>pass rate [interval]</th><th>other statuses</th><th>judge health</th></tr>
{% for m in metrics %}<tr>
<td><code>{{ m.id }}</code></td><td>{{ m.name }}</td><td>{{ "higher" if m.higher_is_better else "lower" }}</td>
<td class="num">{{ m.n_total }}</td><td class="num">{{ m.n_ok }}</td><td class="num">{{ m.mean }}</td>
<td class="num">{{ m.interval }}</td><td class="num">{{ m.pass_rate }}</td><td>{{ m.other }}</td>
<td{% if m.degenerate %} class="worse"{% endif %}>{{ m.health }}</td>
</tr>{% endfor %}
</table>
{% if corrected %}<h3 id="corrected">Corrected by human labels</h3>
<p>Each labelled metric's mean corrected by the labels (prediction-powered inference: the metric's
mean over unlabelled rows minus its mean error on the labelled rows, the error weighted by
&lambda;), beside its own mean and the labels' mean, with {{ confidence_label }} intervals. Labels
must be a random sample of the rows (see docs/ppi.md).</p>
<table id="corrected-table">
<tr><th>metric</th><th>label column</th><th>ok</th><th>labelled</th><th>metric mean [interval]</th><th>labels mean [interval]</th><th>corrected mean [interval]</th><th>&lambda;</th><th>note</th></tr>
{% for r in corrected %}<tr><td><code>{{ r.metric }}</code></td><td><code>{{ r.label_column }}</code></td>
<td class="num">{{ r.n_ok }}</td><td class="num">{{ r.n_labelled }}</td><td class="num">{{ r.mean }} {{ r.mean_interval }}</td>
<td class="num">{{ r.labels_mean }} {{ r.labels_interval }}</td><td class="num">{{ r.ppi_mean }} {{ r.ppi_interval }}</td>
<td class="num">{{ r.ppi_lambda }}</td><td>{{ r.note }}</td></tr>
{% endfor %}</table>{% endif %}
{% if panels %}<h3 id="panels">Judge panels</h3>
<p>Metrics judged by several engines: the table above gives each panel's combined cells and, as
<code>metric[judge]</code>, each judge's own. Agreement between the judges over the rows: Krippendorff's
alpha (nominal for 0/1 metrics, interval otherwise; 1 is perfect agreement, 0 what chance gives) with its
bootstrap interval, and per pair of judges the share of equal scores (0/1) or the mean absolute difference
(see docs/panels.md).</p>
<table id="panels-table">
<tr><th>metric</th><th>combine</th><th>alpha</th><th>interval</th><th>pairwise</th><th>judge means</th><th>note</th></tr>
{% for r in panels %}<tr><td><code>{{ r.metric }}</code></td><td>{{ r.combine }}</td><td class="num">{{ r.alpha }}</td>
<td class="num">{{ r.interval }}</td><td>{{ r.pairwise_measure }}: {{ r.pairwise }}</td><td>{{ r.means }}</td><td>{{ r.note }}</td></tr>
{% endfor %}</table>{% endif %}
<h3>Score distributions</h3>
<div class="charts" id="distributions">
{% for m in metrics %}<figure class="chart"><img alt="distribution of {{ m.id }} scores" src="{{ m.chart }}"></figure>
{% endfor %}</div>

<h2 id="slices">Slices</h2>
{% if not slices %}<p class="muted">The run summary has no per-slice rows (the run has no slice columns, or its summary predates them).</p>{% endif %}
{% for s in slices %}
<h3>{{ s.column }} <span class="muted">({{ s.n_values }} values{% if s.pooled %}; {{ s.pooled }} of them pooled as "other values"{% endif %})</span></h3>
{% if s.chart %}<figure class="chart"><img alt="means by {{ s.column }}" src="{{ s.chart }}"></figure>{% endif %}
<details{% if s.open %} open{% endif %}><summary>table: mean [{{ confidence_label }} interval] (ok cells) per value</summary>
<div class="wide"><table class="slice-table">
<tr><th>{{ s.column }}</th>{% for mid in s.metric_ids %}<th><code>{{ mid }}</code></th>{% endfor %}</tr>
{% for row in s.rows %}<tr><td>{{ row.label }}</td>{% for cell in row.cells %}<td class="num">{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table></div></details>
{% endfor %}

<h2 id="statuses">Statuses</h2>
<p>{{ status_line }}</p>
<figure class="chart"><img alt="cells by status" src="{{ status_chart }}"></figure>
<table id="status-table">
<tr><th>metric</th>{% for s in statuses %}<th>{{ s }}</th>{% endfor %}</tr>
{% for row in status_rows %}<tr><td><code>{{ row.metric }}</code></td>{% for n in row.counts %}<td class="num">{{ n }}</td>{% endfor %}</tr>
{% endfor %}</table>

{% if calibration %}
<h2 id="calibration">Agreement with human labels</h2>
<p>Judge metrics against human labels, from calibration <code>{{ calibration.run_id }}</code> under
{{ calibration.root }} (matched by judge model and prompt version; <code>ragbatch calibrate</code>).
Intervals are percentile bootstraps; a value below the run's minimum is marked.</p>
<table id="calibration-table">
<tr><th>metric</th><th>judge</th><th>model</th><th>measure</th><th>n</th><th>value</th><th>interval</th><th>minimum</th><th>note</th></tr>
{% for r in calibration.rows %}<tr><td><code>{{ r.metric }}</code></td><td>{{ r.judge }}</td><td><code>{{ r.model }}</code></td>
<td>{{ r.measure }}</td><td class="num">{{ r.n }}</td><td class="num{% if r.below %} worse{% endif %}">{{ r.value }}</td>
<td class="num">{{ r.interval }}</td><td class="num">{{ r.minimum }}</td><td>{{ r.note }}</td></tr>
{% endfor %}</table>
{% if calibration.reliability %}<p>Reliability of the judges' probabilities (<code>score: probability</code>): each point is a
bin of stated probabilities, its mean against the share of rows humans labelled 1, with its row count;
a calibrated judge lies on the diagonal.</p>
<div class="charts" id="reliability">
{% for c in calibration.reliability %}<figure class="chart"><img alt="reliability of {{ c.metric }} ({{ c.judge }})" src="{{ c.chart }}"></figure>
{% endfor %}</div>{% endif %}
{% endif %}

{% if comparison %}
<h2 id="comparison">Comparison with baseline <code>{{ comparison.baseline }}</code></h2>
<p>{{ comparison.pairing }}</p>
{% for note in comparison.notes %}<p class="note">{{ note }}</p>{% endfor %}
<p>Paired differences (this run minus the baseline) over rows <code>ok</code> in both runs, with
{{ confidence_label }} paired bootstrap intervals; {{ comparison.flag_rule }}</p>
{% if comparison.chart %}<figure class="chart"><img alt="paired differences by metric" src="{{ comparison.chart }}"></figure>{% endif %}
<table id="comparison-table">
<tr><th>metric</th><th>pairs</th><th>baseline</th><th>this run</th><th>difference</th><th>{{ confidence_label }} interval</th><th>p</th><th>p adjusted</th><th>change</th><th>status changed</th></tr>
{% for r in comparison.rows %}<tr><td><code>{{ r.metric }}</code></td><td class="num">{{ r.n_pairs }}</td>
<td class="num">{{ r.baseline_mean }}</td><td class="num">{{ r.candidate_mean }}</td><td class="num">{{ r.mean_diff }}</td>
<td class="num">{{ r.interval }}</td><td class="num">{{ r.p_value }}</td><td class="num">{{ r.p_adjusted }}</td><td class="{{ r.change or '' }}">{{ r.change or "" }}</td><td class="num">{{ r.n_status_changed }}</td></tr>
{% endfor %}</table>
{% if comparison.status_changes %}<h3>Status changes</h3>
<table><tr><th>metric</th><th>baseline</th><th>this run</th><th>cells</th></tr>
{% for r in comparison.status_changes %}<tr><td><code>{{ r.metric }}</code></td><td>{{ r.baseline_status }}</td><td>{{ r.candidate_status }}</td><td class="num">{{ r.n }}</td></tr>
{% endfor %}</table>{% endif %}
{% if comparison.moved %}<h3>Rows that moved most</h3>
<table id="moved-rows">
<tr><th>metric</th><th>row</th><th>score</th><th>question</th><th>baseline answer</th><th>answer in this run</th><th>reasons</th></tr>
{% for r in comparison.moved %}<tr><td><code>{{ r.metric }}</code></td><td><code>{{ r.row }}</code></td>
<td class="num {{ r.change }}">{{ r.scores }}</td>
{% if r.pii %}<td class="hidden-pii" colspan="3">texts hidden: PII metric</td>{% else %}
<td class="text">{{ r.question }}</td><td class="text">{{ r.baseline_answer }}</td><td class="text">{{ r.candidate_answer }}</td>{% endif %}
<td class="text">baseline: {{ r.baseline_reason }}<br>this run: {{ r.candidate_reason }}</td></tr>
{% endfor %}</table>{% endif %}
{% endif %}

{% if trend %}
<h2 id="trend">Trend over the last {{ trend.nights }} runs</h2>
<p>Each metric's mean with its {{ confidence_label }} interval in every committed run under this output
root up to this one (oldest first; from each run's summary), all rows and per slice value for slice
columns with few values. A shift is marked when the last {{ trend.shift_nights }} runs' intervals all lie
on one side of the median of the earlier runs' means: a move that has lasted, not one night's noise.</p>
{% if trend.shifts %}<table id="trend-shifts">
<tr><th>metric</th><th>slice</th><th>shift</th><th>reference (earlier median)</th><th>latest means</th><th>runs in a row</th></tr>
{% for s in trend.shifts %}<tr><td><code>{{ s.metric }}</code></td><td>{{ s.slice }}</td><td class="{{ s.change }}">{{ s.direction }} ({{ s.change }})</td>
<td class="num">{{ s.reference }}</td><td class="num">{{ s.latest }}</td><td class="num">{{ s.nights }}</td></tr>
{% endfor %}</table>{% else %}<p id="trend-shifts" class="muted">No shift has lasted {{ trend.shift_nights }} runs.</p>{% endif %}
<div class="charts" id="trends">
{% for c in trend.charts %}<figure class="chart"><img alt="trend of {{ c.metric }}" src="{{ c.chart }}"></figure>
{% endfor %}</div>
<details><summary>table: all-rows mean [{{ confidence_label }} interval] per run</summary>
<div class="wide"><table id="trend-table">
<tr><th>run date</th><th>run id</th>{% for mid in trend.metric_ids %}<th><code>{{ mid }}</code></th>{% endfor %}</tr>
{% for row in trend.table %}<tr><td>{{ row.run_date }}</td><td><code>{{ row.run_id }}</code></td>{% for cell in row.cells %}<td class="num">{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table></div></details>
{% endif %}

<h2 id="worst">Worst rows</h2>
<p>Per metric, the {{ top }} lowest-scoring <code>ok</code> cells (highest for lower-is-better metrics;
ties by row id), then up to {{ top }} cells that failed (any status but <code>ok</code> and
<code>not_applicable</code>). Texts are cut at {{ clip }} characters; PII metrics never show them.</p>
{% for w in worst %}
<h3><code>{{ w.metric }}</code> <span class="muted">{{ w.summary }}</span></h3>
{% if w.rows %}<table class="worst-rows">
<tr><th>row</th><th>score</th><th>status</th><th>question</th><th>answer</th><th>contexts</th><th>reason</th><th>judge reply</th></tr>
{% for r in w.rows %}<tr><td><code>{{ r.row_id }}</code></td><td class="num">{{ r.score }}</td><td>{{ r.status }}</td>
{% if w.pii %}<td class="hidden-pii" colspan="3">texts hidden: PII metric</td>{% else %}
<td class="text">{{ r.question }}</td><td class="text">{{ r.answer }}</td><td class="text">{{ r.contexts }}</td>{% endif %}
<td class="text">{{ r.reason }}</td><td class="text">{{ r.judge_reply }}</td></tr>
{% endfor %}</table>{% else %}<p class="muted">No cells to list.</p>{% endif %}
{% endfor %}
<p class="muted">Generated by ragbatch {{ version }} from {{ run.root }}.</p>
</body>
</html>
"""
