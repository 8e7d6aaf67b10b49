"""How many requests an ``openai`` engine keeps in flight: an AIMD concurrency limit and
an engine-wide pause for ``Retry-After``.

:class:`AimdLimit` is the rule, pure and synchronous: it is told what happened to each
reply (a success and its reply time, or a rate limit) and says how many requests may be
in flight. :class:`SendGate` applies it on the engine's event loop: every attempt of
every request waits in the gate for a free slot, and retries go before new requests.

The rule is TCP's congestion control (Jacobson, "Congestion Avoidance and Control",
SIGCOMM 1988; RFC 5681, "TCP Congestion Control", sections 3.1 and 3.2), with the
concurrency limit in the role of the congestion window, one reply in the role of an
acknowledgement and an HTTP 429 reply in the role of a lost segment:

* **Slow start.** The limit starts at its floor and grows by one with every success
  (it doubles per round trip) until the first rate limit, or until it reaches the
  ceiling.
* **Additive increase** (congestion avoidance). After the first rate limit the limit
  grows by one after each window of successes: as many successes in a row as the
  limit's slots, without a rate limit between them.
* **Multiplicative decrease.** A rate limit multiplies the limit by
  :data:`DECREASE_FACTOR`, 0.7 (never below the floor), and ends slow start for good.
  RFC 5681 halves; 0.7 is CUBIC's factor (RFC 9438, section 4.6), the default of
  Linux's TCP. Against a provider's token bucket that holds few requests, halving left
  the limit below what the rate needed for longer: 0.50 of a 25-requests-a-second limit
  used against 0.72 with 0.7, and no less with a deeper bucket
  (docs/benchmarks/rate-limits.md).
* **One decrease per window.** Each decrease starts a new *epoch*, and every slot
  carries the epoch it was granted in. Replies to requests sent before the latest
  decrease neither lower the limit again nor count towards the next increase: the
  requests in flight when the first 429 came back are answered 429 too, and they say
  nothing new (RFC 5681 reduces the window once per loss event in the same way).
* **Optional latency signal.** With ``latency_backoff = f``, a success of the current
  epoch whose reply time exceeds ``f`` times the lowest reply time seen so far counts
  as a rate limit (without a pause), for servers that queue instead of refusing (the
  delay-based congestion signal of TCP Vegas, Brakmo and Peterson 1995, in its
  simplest form).

The limit is a float and the slots are its integer part, so a decrease from 3 gives 2.1
(2 slots) and from 2 gives 1.4 (1 slot), whose next increase is 2.4 (2 slots): the
fraction is kept rather than rounded away at every decrease.

**Pacing.** Slots freed together (the end of a pause, an increase) would send their
requests in the same instant, and a provider's token bucket that holds only a few
requests refuses all but the first of such a burst, however low the average rate. So
the gate spreads the sends of a window over a round trip, as paced TCP does
(Aggarwal, Savage and Anderson, "Understanding the Performance of TCP Pacing",
INFOCOM 2000): consecutive sends are at least ``srtt / (slots * gain)`` seconds
apart, where ``srtt`` is the smoothed reply time of successes (Jacobson's estimator,
gain 1/8; RFC 6298 section 2) and ``gain`` is 2 in slow start and 1.2 after it (the
defaults of Linux's ``tcp_pacing_ss_ratio`` and ``tcp_pacing_ca_ratio``), so that the
pacing never holds the window below what it would send unpaced over a round trip.
Before the first success there is no reply time and no pacing.

``Retry-After`` applies to the whole engine: a 429 carrying it pauses every new send
until that time has passed (a provider that rate limits one request rate limits them
all). Overlapping pauses are merged: the time paused counts each second once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

#: Limit changes :attr:`AimdLimit.changes` keeps (the latest ones).
MAX_CHANGES_KEPT = 10_000
#: What a decrease multiplies the limit by: CUBIC's beta (RFC 9438); RFC 5681 halves.
DECREASE_FACTOR = 0.7
#: Weight of a new reply time in the smoothed reply time (RFC 6298's alpha).
SRTT_GAIN = 1.0 / 8.0
#: Sends per round trip paced, as multiples of the slots: in slow start, and after it.
PACING_GAIN_SLOW_START = 2.0
PACING_GAIN = 1.2


class AimdLimit:
    """An additive-increase, multiplicative-decrease limit on requests in flight.

    Parameters
    ----------
    ceiling : int
        Most requests in flight, at least 1 (the config's ``max_concurrency``).
    floor : int, default 1
        Fewest, between 1 and ``ceiling`` (``min_concurrency``); also where the
        limit starts.
    adaptive : bool, default True
        False fixes the limit at ``ceiling`` and never pauses; the events are still
        counted (the config's ``adaptive_concurrency: false``).
    latency_backoff : float, optional
        Above 1: a success whose reply time exceeds this multiple of the lowest one
        seen lowers the limit as a rate limit does. None (the default) reads no
        reply times.
    decrease : float, optional
        What a decrease multiplies the limit by, in (0, 1); default
        :data:`DECREASE_FACTOR`.

    Attributes
    ----------
    limit : float
        The current limit, in ``[floor, ceiling]``.
    epoch : int
        Number of decreases so far (also at the floor, where the limit stays the same);
        slots granted before the latest one carry a smaller number.
    paused_until : float
        Clock value (seconds, as passed to :meth:`on_rate_limit`) before which no
        request may be sent; 0 when never paused.
    srtt : float or None
        Smoothed reply time of successes, in seconds (None before the first, and when
        the limit is not adaptive).
    changes : collections.deque of (str, int)
        ``("increase" | "decrease", slots after the change)`` for each change of the
        slots, oldest first, at most :data:`MAX_CHANGES_KEPT`.

    Raises
    ------
    ValueError
        ``ceiling`` below 1, ``floor`` outside ``[1, ceiling]``, ``latency_backoff``
        not above 1, or ``decrease`` outside (0, 1).
    """

    def __init__(
        self,
        ceiling: int,
        floor: int = 1,
        adaptive: bool = True,
        latency_backoff: float | None = None,
        decrease: float | None = None,
    ) -> None:
        if ceiling < 1 or not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor={floor}, ceiling={ceiling}")
        if latency_backoff is not None and latency_backoff <= 1:
            raise ValueError(f"latency_backoff must exceed 1, got {latency_backoff}")
        decrease = DECREASE_FACTOR if decrease is None else decrease
        if not 0 < decrease < 1:
            raise ValueError(f"decrease must lie in (0, 1), got {decrease}")
        self.decrease = decrease
        self.ceiling = ceiling
        self.floor = floor
        self.adaptive = adaptive
        self.latency_backoff = latency_backoff
        self.limit = float(floor if adaptive else ceiling)
        self.epoch = 0
        self.paused_until = 0.0
        self.srtt: float | None = None
        self.changes: deque[tuple[str, int]] = deque(maxlen=MAX_CHANGES_KEPT)
        self._slow_start = adaptive
        self._acked = 0
        self._fastest: float | None = None
        self._high = self.slots
        self._low: int | None = None
        self._rate_limited = 0
        self._decreases = 0
        self._latency_decreases = 0
        self._paused_s = 0.0

    @property
    def slots(self) -> int:
        """Requests that may be in flight now: the integer part of :attr:`limit`."""
        return int(self.limit)

    # ----------------------------------------------------------------- events

    def on_success(self, epoch: int, latency_s: float) -> None:
        """A reply came back (HTTP 200).

        Parameters
        ----------
        epoch : int
            :attr:`epoch` when the request's slot was granted.
        latency_s : float
            Seconds from sending the request to its reply (>= 0).
        """
        if not self.adaptive:
            return
        fastest = latency_s if self._fastest is None else min(self._fastest, latency_s)
        self._fastest = fastest
        self.srtt = (
            latency_s if self.srtt is None else self.srtt + SRTT_GAIN * (latency_s - self.srtt)
        )
        if epoch != self.epoch:
            return
        if self.latency_backoff is not None and latency_s > self.latency_backoff * fastest:
            self._latency_decreases += 1
            self._decrease()
            return
        if self._slow_start:
            self._grow()
            return
        self._acked += 1
        if self._acked >= self.slots:
            self._acked = 0
            self._grow()

    def on_rate_limit(self, epoch: int, now: float, retry_after: float | None) -> None:
        """An HTTP 429 reply came back.

        Parameters
        ----------
        epoch : int
            :attr:`epoch` when the request's slot was granted.
        now : float
            The clock, in seconds (the event loop's ``time()``).
        retry_after : float, optional
            Seconds the server asked to wait (``Retry-After``); pauses every new send
            for that long. Ignored when the limit is not adaptive.
        """
        self._rate_limited += 1
        if not self.adaptive:
            return
        if retry_after is not None and retry_after > 0:
            self._pause(now + retry_after, now)
        if epoch == self.epoch:
            self._decrease()

    def pause_left(self, now: float) -> float:
        """Seconds until sends may resume (0 when not paused)."""
        return max(self.paused_until - now, 0.0)

    def send_interval(self) -> float:
        """Fewest seconds between two sends: ``srtt / (slots * gain)`` (see the module
        notes), 0.0 before the first success or when the limit is not adaptive."""
        if self.srtt is None:
            return 0.0
        gain = PACING_GAIN_SLOW_START if self._slow_start else PACING_GAIN
        return self.srtt / (self.slots * gain)

    # -------------------------------------------------------------- changes

    def _grow(self) -> None:
        before = self.slots
        self.limit = min(self.limit + 1.0, float(self.ceiling))
        if self.slots != before:
            self._high = max(self._high, self.slots)
            self.changes.append(("increase", self.slots))

    def _decrease(self) -> None:
        before = self.slots
        self.epoch += 1
        self._slow_start = False
        self._acked = 0
        self.limit = max(self.limit * self.decrease, float(self.floor))
        self._low = self.slots if self._low is None else min(self._low, self.slots)
        if self.slots != before:
            self._decreases += 1
            self.changes.append(("decrease", self.slots))

    def _pause(self, until: float, now: float) -> None:
        if until <= self.paused_until:
            return
        self._paused_s += until - max(self.paused_until, now)
        self.paused_until = until

    # ---------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        """What the limit did since it was made.

        Returns
        -------
        dict
            ``rate_limited`` (int: 429 replies), ``concurrency`` (int: slots now),
            ``concurrency_max`` (int: most slots reached), ``concurrency_min`` (int:
            fewest slots a decrease left, or the slots now when there was none; slow
            start's climb from the floor does not count), ``concurrency_decreases``
            (int: decreases that lowered the slots), ``latency_decreases`` (int: of the
            decreases, those a slow reply caused) and ``retry_after_paused_s`` (float,
            seconds: time during which ``Retry-After`` held back new sends).
        """
        return {
            "rate_limited": self._rate_limited,
            "concurrency": self.slots,
            "concurrency_max": self._high,
            "concurrency_min": self.slots if self._low is None else self._low,
            "concurrency_decreases": self._decreases,
            "latency_decreases": self._latency_decreases,
            "retry_after_paused_s": round(self._paused_s, 3),
        }


class SendGate:
    """Slots for requests in flight on one event loop, as many as an :class:`AimdLimit`
    allows, held back while it is paused.

    A waiting retry is granted a slot before any waiting first attempt, so a request
    that met a rate limit is not queued behind every request sent after it; within each
    kind, first come, first served. Two grants are at least the limit's
    :meth:`~AimdLimit.send_interval` apart (pacing). Methods must be called on the loop
    that runs the gate.

    Parameters
    ----------
    limit : AimdLimit
        The rule; the gate reads its :attr:`~AimdLimit.slots` and
        :attr:`~AimdLimit.paused_until` whenever a slot is asked for or given back.

    Attributes
    ----------
    in_flight : int
        Slots held now.
    """

    def __init__(self, limit: AimdLimit) -> None:
        self.limit = limit
        self.in_flight = 0
        self._retries: deque[asyncio.Future[int]] = deque()
        self._first: deque[asyncio.Future[int]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._next_send = 0.0

    async def acquire(self, retry: bool = False) -> int:
        """Wait for a slot.

        Parameters
        ----------
        retry : bool, default False
            True for a request's second or later attempt (served first).

        Returns
        -------
        int
            The limit's epoch when the slot was granted: pass it to the limit's
            ``on_success`` / ``on_rate_limit``. Give the slot back with :meth:`release`.
        """
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        (self._retries if retry else self._first).append(waiter)
        self._dispatch()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted, then cancelled before it was used
            raise

    def release(self) -> None:
        """Give a slot back (after the limit has been told how the attempt went)."""
        self.in_flight -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Grant slots to waiters while the limit allows, no pause holds and the pacing
        interval has passed; otherwise come back when it has."""
        loop = asyncio.get_running_loop()
        while self.in_flight < self.limit.slots and (self._retries or self._first):
            now = loop.time()
            wait = max(self.limit.pause_left(now), self._next_send - now)
            if wait > 0:
                if self._timer is None:
                    self._timer = loop.call_later(wait, self._on_timer)
                return
            waiter = self._next_waiter()
            if waiter is None:
                return
            self.in_flight += 1
            self._next_send = now + self.limit.send_interval()
            waiter.set_result(self.limit.epoch)

    def _next_waiter(self) -> asyncio.Future[int] | None:
        for queue in (self._retries, self._first):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():  # a cancelled waiter is skipped
                    return waiter
        return None

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()  # sets a new timer if the pause was extended meanwhile
