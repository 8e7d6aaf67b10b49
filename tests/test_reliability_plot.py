"""The reliability diagram of the calibration report section."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET

from ragbatch.analysis.plots import data_uri, reliability_diagram


def test_reliability_diagram_is_svg_with_literal_text():
    title = r"$\frac{a}{b}$ (judge)"
    svg = reliability_diagram([0.15, 0.96], [0.5, 1.0], [2, 7], title=title)
    root = ET.fromstring(svg)
    texts = "".join(root.itertext())
    assert r"$\frac{a}{b}$ (judge)" in texts  # shown as written, not as mathtext
    assert "judge's probability of 1" in texts and "7" in texts
    uri = data_uri(svg)
    assert base64.b64decode(uri.split(",", 1)[1]).decode("utf-8") == svg
