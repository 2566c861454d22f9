"""``bench wan --rates`` and ``--delay-ms``: each WAN row's link, its rate in Mbit/s each way or
as a wire factor.

``4x`` is the rate at which one step's uncompressed wire, in the slower direction, takes 4 times
the compute of the busier side in one cluster: the paper's regime is about 4. A factor follows
the host: where a step computes longer, the same regime is a slower link, so a claim made in the
regime can be checked on any machine. It is resolved once, from the first repeat's in-cluster
row (uncompressed: :class:`nebula_mq.bench.wan_auto.Profile`), so every repeat runs one link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nebula_mq.bench.wan_auto import Profile


@dataclass(frozen=True)
class WireFactor:
    """A rate given as the uncompressed wire's multiple of the compute (``4x``)."""

    factor: float

    def __str__(self) -> str:
        return f"{self.factor:g}x"


Rate = float | WireFactor


def numbers(text: str, flag: str, allow_zero: bool = False) -> list[float]:
    """``10,60`` as numbers; anything else is a one-line ConfigError naming ``flag``."""
    from nebula_mq.errors import ConfigError

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError("<command line>", flag, "numbers separated by commas, like 10,60", text) from None
    if not values or any(v < 0 or (v == 0 and not allow_zero) for v in values):
        raise ConfigError("<command line>", flag, "positive numbers separated by commas, like 10,60", text)
    return values


RATES_EXPECTED = "Mbit/s or wire factors separated by commas, like 10,60 or 4x (the uncompressed wire 4x the compute)"


def link_rates(text: str) -> list[Rate]:
    """``10,60,4x`` as rates; anything else is a one-line ConfigError naming ``--rates``."""
    from nebula_mq.errors import ConfigError

    out: list[Rate] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part.removesuffix("x"))
        except ValueError:
            raise ConfigError("<command line>", "--rates", RATES_EXPECTED, text) from None
        if not 0 < value < float("inf"):
            raise ConfigError("<command line>", "--rates", RATES_EXPECTED, text)
        out.append(WireFactor(value) if part.endswith("x") else value)
    if not out:
        raise ConfigError("<command line>", "--rates", RATES_EXPECTED, text)
    return out


def rate_name(rate: Rate) -> str:
    """The rate's part of a row's name: ``2.7mbit`` or ``4x``."""
    return str(rate) if isinstance(rate, WireFactor) else f"{rate:g}mbit"


def resolve(rate: Rate, found: Profile | None) -> float:
    """``rate`` in Mbit/s: a factor from what the in-cluster row measured."""
    if not isinstance(rate, WireFactor):
        return rate
    if found is None:
        raise RuntimeError("the in-cluster row runs before any WAN row")
    return float(f"{found.rate_for(rate.factor):.3g}")  # a link as one would write it


def factor_notes(rates: Sequence[Rate], found: Profile | None) -> list[str]:
    """A line under the table for each factor: the rate it became, and from what."""
    if found is None:
        return []
    return [f"{r}: {resolve(r, found):.3g} Mbit/s each way ({max(found.forward_bytes, found.backward_bytes) / 1e3:.0f} "
            f"kB uncompressed a step in the slower direction, {found.compute_s * 1000:.0f} ms of compute a step "
            f"in one cluster)" for r in rates if isinstance(r, WireFactor)]
