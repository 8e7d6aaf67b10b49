"""Cost of the per-answer time limit on the Python-re path of the `regex` metric.

Matches one pattern that needs Python re (a look-behind) against 100,000 short answers,
in-process and through ragbatch.core.time_limit.map_with_time_limit, in the same process, and
prints the ratio. Run: .venv/bin/python benchmarks/time_limit.py
"""

from __future__ import annotations

import re
import time

from ragbatch.core.time_limit import map_with_time_limit


def main(n: int = 100_000, repeats: int = 3) -> None:
    pattern = re.compile(r"(?<=a)b+$")
    answers = [f"answer {i} aab" if i % 2 else f"answer {i} 数据" for i in range(n)]

    def match(text: str) -> bool:
        return pattern.search(text) is not None

    best_plain = best_limited = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        plain = [match(a) for a in answers]
        best_plain = min(best_plain, time.perf_counter() - t)
        t = time.perf_counter()
        limited = map_with_time_limit(match, answers, 2.0)
        best_limited = min(best_limited, time.perf_counter() - t)
        assert plain == limited
    print(
        f"{n} answers: in-process {best_plain:.3f} s, time-limited {best_limited:.3f} s, "
        f"ratio {best_limited / best_plain:.1f}x"
    )


if __name__ == "__main__":
    main()
